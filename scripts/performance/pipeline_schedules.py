#!/usr/bin/env python3
"""Step time of every pipeline schedule through ``pretrain()``, measured side by side in one run.

    python scripts/performance/pipeline_schedules.py [--ranks 2] [--steps 12] [--rounds 3] [key=value ...]

On ``--ranks`` processes, each round runs, in this order: PP=1 (data parallel over all ranks, the baseline),
1F1B at PP=ranks, and Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble and DualPipeV at PP=ranks × VP=2, with
the same model (the tiny recipe with ``--layers`` layers), global batch and micro-batch size. Rounds interleave so
machine noise hits all variants alike. The first ``--warmup`` steps of every run are dropped; each variant's step
time is the median over all kept steps of all rounds, and ratios are against 1F1B. Trailing ``key=value``
overrides apply to the tiny recipe. On a CPU the pipeline has no idle hardware to fill, so the ratios show the
schedules' own overhead (communication, bookkeeping), not the bubble savings they buy on GPUs.
"""

import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist


VARIANTS: dict[str, tuple[int | None, str | None]] = {
    "PP1 (data parallel)": (None, None),
    "1F1B": (None, "1F1B"),
    "Interleaved1F1B": (2, "Interleaved1F1B"),
    "InterleavedZeroBubble": (2, "InterleavedZeroBubble"),
    "ZBVZeroBubble": (2, "ZBVZeroBubble"),
    "DualPipeV": (2, "DualPipeV"),
}
"""Variant name → (virtual stages per rank, schedule); None schedule: no pipeline."""


def parse_args() -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2, help="processes (pipeline ranks)")
    p.add_argument("--steps", type=int, default=12, help="steps per run")
    p.add_argument("--warmup", type=int, default=3, help="steps dropped at the start of every run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("overrides", nargs="*")
    return p.parse_args()


def make_config(args: argparse.Namespace, vp: int | None, schedule: str | None):  # noqa: ANN201
    """The tiny recipe with benchmark settings and the variant's pipeline layout."""
    from megatron_bridge.recipes import tiny_llama_pretrain_config
    from megatron_bridge.recipes.perf import common_perf_overrides

    cfg = tiny_llama_pretrain_config(global_batch_size=8 * args.ranks, micro_batch_size=2)
    cfg = common_perf_overrides(cfg, train_iters=args.steps, warmup_iters=1)
    cfg.logger.log_interval = args.steps
    cfg.model.num_layers = args.layers
    if schedule is not None:
        cfg.model.pipeline_model_parallel_size = args.ranks
        cfg.model.virtual_pipeline_model_parallel_size = vp
        cfg.model.pipeline_schedule = schedule
    return cfg.apply_overrides(overrides=args.overrides)


def main() -> int:
    """Entry point (re-launches itself under torchrun)."""
    args = parse_args()
    from megatron_bridge.launcher.local import relaunch_with_torchrun
    from megatron_bridge.utils.launch import end_worker, running_under_torchrun

    if not running_under_torchrun():
        return relaunch_with_torchrun(args.ranks, [os.path.abspath(__file__), *sys.argv[1:]], threads_per_rank=1)
    import logging

    from megatron_bridge.training.pretrain import pretrain

    logging.getLogger("megatron_bridge").setLevel(logging.WARNING)
    logging.getLogger("torch.distributed.pipelining").setLevel(logging.ERROR)
    # The benchmark owns the process group (pretrain() reuses it and leaves it alone).
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    kept: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, (vp, schedule) in VARIANTS.items():
            kept[name] += pretrain(make_config(args, vp, schedule)).step_times[args.warmup:]
            dist.barrier()
    if dist.get_rank() == 0:
        med = {name: statistics.median(t) for name, t in kept.items()}
        print(f"# {dist.get_world_size()} ranks, {args.layers} layers, {args.rounds} rounds x {args.steps} steps, "
              f"median step time over {len(kept['1F1B'])} kept steps per variant")
        for name, value in med.items():
            print(f"{name:>22s}: {value * 1000:8.1f} ms/step   ratio to 1F1B {value / med['1F1B']:.3f}")
    return end_worker(0)


if __name__ == "__main__":
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
