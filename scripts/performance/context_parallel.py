#!/usr/bin/env python3
"""Context parallelism on CPU: CP=2 vs CP=1 step time and per-rank activation memory for a long sequence.

    python scripts/performance/context_parallel.py [--seq 4096] [--steps 5] [--rounds 3]

Runs on 2 gloo ranks (re-launches itself under torchrun, one thread per rank). Each round times, side by side, the
same model (a 2-layer Llama, hidden 256, 8 heads / 2 KV groups) on one sequence of ``--seq`` tokens: CP=1 on rank 0
alone (the whole sequence), then CP=2 on both ranks (each its zig-zag half, keys/values all-gathered). A step is a
forward and a backward pass. Activation memory is the bytes of the tensors autograd saves for backward during the
forward (parameters excluded), per rank. The losses of the two runs are checked to agree. Ratios: CP=2 / CP=1.
"""

import argparse
import copy
import datetime
import os
import platform
import statistics
import sys
import time


def parse_args() -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=4096, help="tokens per sequence (divisible by 4)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per variant and round")
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args()


def _step(model, ids, labels, n_tokens: int, params: set[int]) -> tuple[float, float, int]:  # noqa: ANN001
    """Forward + backward; returns (seconds, local loss sum, saved activation bytes)."""
    import torch

    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in params:
            saved[0] += t.numel() * t.element_size()
        return t

    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(ids, labels=labels).sum()
    (loss / n_tokens).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start, float(loss.detach()), saved[0]


def run(args: argparse.Namespace) -> None:
    """The benchmark on every rank; rank 0 prints the summary."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.config.model import ModelConfig
    from megatron_bridge.data.zigzag import zigzag_slice
    from megatron_bridge.distributed.context_parallel import apply_context_parallel
    from megatron_bridge.models.llama import LlamaModel

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model_cfg = ModelConfig(num_layers=2, hidden_size=256, ffn_hidden_size=688, num_attention_heads=8,
                            num_query_groups=2, vocab_size=1024, seq_length=args.seq)
    torch.manual_seed(0)
    single = LlamaModel(model_cfg, device="cpu")
    cp_model = copy.deepcopy(single)
    cfg = ConfigContainer(model=copy.deepcopy(model_cfg))
    cfg.model.context_parallel_size = world
    apply_context_parallel(cp_model, init_device_mesh("cpu", (world,), mesh_dim_names=("cp",)), cfg)
    ids = torch.randint(0, 1024, (1, args.seq), generator=torch.Generator().manual_seed(1))
    labels = torch.roll(ids, -1, dims=1)
    local_ids, local_labels = zigzag_slice(ids, world, rank), zigzag_slice(labels, world, rank)
    params = {p.data_ptr() for m in (single, cp_model) for p in m.parameters()}
    times: dict[str, list[float]] = {"cp1": [], "cp2": []}
    memory, losses = {}, {}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        if rank == 0:
            for _ in range(args.steps):
                seconds, losses["cp1"], memory["cp1"] = _step(single, ids, labels, args.seq, params)
                if round_:
                    times["cp1"].append(seconds)
        dist.barrier()
        for _ in range(args.steps):
            seconds, local_loss, memory["cp2"] = _step(cp_model, local_ids, local_labels, args.seq, params)
            if round_:
                times["cp2"].append(seconds)
        total = torch.tensor([local_loss], dtype=torch.float64)
        dist.all_reduce(total)
        losses["cp2"] = float(total)
        dist.barrier()
    if rank == 0:
        _report(args, times, memory, losses, torch.__version__)
    dist.barrier()


def _report(args: argparse.Namespace, times: dict[str, list[float]], memory: dict[str, int],
            losses: dict[str, float], torch_version: str) -> None:
    t1, t2 = statistics.median(times["cp1"]), statistics.median(times["cp2"])
    m1, m2 = memory["cp1"] / 2**20, memory["cp2"] / 2**20
    rel = abs(losses["cp2"] - losses["cp1"]) / abs(losses["cp1"])
    print(f"context parallelism benchmark, {datetime.date.today()}, {platform.machine()} {os.cpu_count()} cores, "
          f"torch {torch_version}, seq {args.seq}, {args.rounds} rounds x {args.steps} steps (median)")
    print("| variant | step time | activation memory per rank |")
    print("|---|---|---|")
    print(f"| CP=1 (1 rank) | {t1 * 1e3:.0f} ms | {m1:.1f} MiB |")
    print(f"| CP=2 (2 ranks) | {t2 * 1e3:.0f} ms | {m2:.1f} MiB |")
    print(f"| ratio CP=2 / CP=1 | {t2 / t1:.3f} | {m2 / m1:.3f} |")
    print(f"loss sum CP=1 {losses['cp1']:.6f}, CP=2 {losses['cp2']:.6f} (relative difference {rel:.1e})")
    if rel > 1e-5:
        raise SystemExit(f"CP=2 loss differs from CP=1 by {rel:.1e}")


def main() -> int:
    """Entry point (re-launches itself under torchrun on 2 ranks)."""
    args = parse_args()
    from megatron_bridge.launcher.local import relaunch_with_torchrun
    from megatron_bridge.utils.launch import end_worker, running_under_torchrun

    if not running_under_torchrun():
        return relaunch_with_torchrun(2, [os.path.abspath(__file__), *sys.argv[1:]], threads_per_rank=1)
    run(args)
    return end_worker(0)  # gloo can abort at interpreter teardown


if __name__ == "__main__":
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
