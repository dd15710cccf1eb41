#!/usr/bin/env python3
"""Overhead of ``pretrain()`` over a bare PyTorch loop, per backend, measured side by side in one run.

    python scripts/performance/overhead.py [--nproc 2] [--steps 20] [--rounds 3] [key=value ...]

Each round runs, in this order, on the same ranks with the same model, batch shape, optimizer and micro-batching:
bare DDP loop, ``pretrain()`` with DDP, bare ``fully_shard`` loop, ``pretrain()`` with FSDP2. Rounds interleave so
machine noise hits all variants alike. The first ``--warmup`` steps of every run are dropped; each variant's
step time is the median over all kept steps of all rounds. Ratios are ``pretrain`` / bare. Trailing ``key=value``
overrides apply to the tiny recipe that defines the model and batch.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn


def parse_args() -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="steps per run")
    p.add_argument("--warmup", type=int, default=3, help="steps dropped at the start of every run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("overrides", nargs="*")
    return p.parse_args()


def make_config(args: argparse.Namespace, fsdp2: bool):  # noqa: ANN201
    """The tiny recipe with benchmark settings (no eval, no checkpoints, fixed LR warmup)."""
    from megatron_bridge.recipes import tiny_llama_pretrain_config
    from megatron_bridge.recipes.perf import common_perf_overrides

    cfg = tiny_llama_pretrain_config(use_torch_fsdp2=fsdp2)
    cfg = common_perf_overrides(cfg, train_iters=args.steps, warmup_iters=1)
    cfg.logger.log_interval = args.steps
    return cfg.apply_overrides(overrides=args.overrides)


def bare_loop(cfg, fsdp2: bool, device: torch.device) -> list[float]:  # noqa: ANN001
    """The same training by hand: build, wrap (DDP or raw fully_shard), AdamW, accumulate, clip, step."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from megatron_bridge.models import LlamaModel

    torch.manual_seed(cfg.rng.seed)
    model: nn.Module = LlamaModel(cfg.model, device=device)
    world = dist.get_world_size()
    if fsdp2:
        mp = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
        for i, block in enumerate(model.layers):
            fully_shard(block, mp_policy=mp, reshard_after_forward=i < len(model.layers) - 1)
        fully_shard(model, mp_policy=mp, reshard_after_forward=False)
    else:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optimizer.lr, weight_decay=cfg.optimizer.weight_decay,
                                  foreach=True)
    mbs, seq = cfg.train.micro_batch_size, cfg.model.seq_length
    n_micro = cfg.train.global_batch_size // (mbs * world)
    gen = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for _ in range(cfg.train.train_iters):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        for i in range(n_micro):
            tokens = torch.randint(0, cfg.model.vocab_size, (mbs, seq + 1), generator=gen).to(device)
            last = i == n_micro - 1
            if fsdp2:
                model.set_requires_gradient_sync(last)
                ctx = torch.enable_grad()
            else:
                ctx = torch.enable_grad() if last else model.no_sync()
            with ctx:
                loss = model(tokens[:, :-1], labels=tokens[:, 1:]).sum() / (mbs * seq * n_micro)
                loss.backward()
        loss_t = loss.detach().clone()
        dist.all_reduce(loss_t)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optimizer.clip_grad)
        float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def library_loop(cfg) -> list[float]:  # noqa: ANN001
    """The same training through pretrain(); its per-step times."""
    from megatron_bridge.training.pretrain import pretrain

    return pretrain(cfg).step_times


def main() -> int:
    """Entry point (re-launches itself under torchrun)."""
    args = parse_args()
    from megatron_bridge.launcher.local import relaunch_with_torchrun
    from megatron_bridge.utils.launch import end_worker, running_under_torchrun

    if not running_under_torchrun():
        return relaunch_with_torchrun(args.nproc, [os.path.abspath(__file__), *sys.argv[1:]], threads_per_rank=1)
    import logging

    from megatron_bridge.distributed.init import initialize_distributed

    logging.getLogger("megatron_bridge").setLevel(logging.WARNING)
    # The benchmark owns the process group (pretrain() reuses it and leaves it alone).
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    env = initialize_distributed(make_config(args, False))
    variants = {"bare DDP": (False, True), "pretrain DDP": (False, False),
                "bare FSDP2": (True, True), "pretrain FSDP2": (True, False)}
    kept: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (fsdp2, bare) in variants.items():
            cfg = make_config(args, fsdp2)
            cfg.validate()
            times = bare_loop(cfg, fsdp2, env.device) if bare else library_loop(cfg)
            kept[name] += times[args.warmup:]
            dist.barrier()
    if env.rank == 0:
        med = {name: statistics.median(t) for name, t in kept.items()}
        print(f"# {env.world_size} ranks, device {env.device.type}, {args.rounds} rounds x {args.steps} steps, "
              f"median step time over {len(kept['bare DDP'])} kept steps per variant")
        for name, value in med.items():
            print(f"{name:>16s}: {value * 1000:8.1f} ms/step")
        print(f"ratio DDP   pretrain/bare: {med['pretrain DDP'] / med['bare DDP']:.3f}")
        print(f"ratio FSDP2 pretrain/bare: {med['pretrain FSDP2'] / med['bare FSDP2']:.3f}")
    return end_worker(0)


if __name__ == "__main__":
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
