"""What the attention benchmarks share (``window_attention.py``, ``sink_attention.py``, ``softcap_attention.py``):
their command line, their inputs, one thread, and timing variants interleaved round by round (this machine is
shared and noisy: a round's variants run back to back, under about the same load)."""

import argparse
import datetime
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any


def attention_parser(doc: str, *, kv_heads: int, steps: int, rounds: int) -> argparse.ArgumentParser:
    """The shape and repetition flags every attention benchmark takes."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=kv_heads)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--steps", type=int, default=steps, help="passes per variant and round")
    p.add_argument("--rounds", type=int, default=rounds)
    return p


def setup(args: argparse.Namespace, extra: str = "") -> Any:
    """One thread, seed 0; prints the machine line; returns torch."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"# {datetime.date.today()} {platform.machine()} torch {torch.__version__}, 1 thread; batch {args.batch}, "
          f"heads {args.heads}/{args.kv_heads}, head dim {args.head_dim}; {args.rounds} rounds x {args.steps} "
          f"passes, medians{extra}")
    return torch


def qkv(args: argparse.Namespace, s: int) -> tuple[Any, Any, Any]:
    """Random ``q`` ``[batch, heads, s, d]`` and ``k``, ``v`` ``[batch, kv_heads, s, d]`` that need gradients."""
    import torch

    q = torch.randn(args.batch, args.heads, s, args.head_dim, requires_grad=True)
    k, v = (torch.randn(args.batch, args.kv_heads, s, args.head_dim, requires_grad=True) for _ in range(2))
    return q, k, v


def interleaved(variants: dict[str, Callable[[], object]], rounds: int, steps: int) -> dict[str, list[float]]:
    """Seconds per pass of each variant, one entry per round; each round runs every variant ``steps`` times."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            times[name].append((time.perf_counter() - start) / steps)
    return times


def median_ratio(times: list[float], baseline: list[float]) -> float:
    """The median over the rounds of each round's ratio ``times / baseline``."""
    return statistics.median(a / b for a, b in zip(times, baseline, strict=True))


def pair_cells(times: dict[str, list[float]], baseline: str, variant: str) -> str:
    """``baseline ms | variant ms | ratio`` of a table row: each variant's median pass in milliseconds, then the
    median ratio of ``variant`` to ``baseline`` (:func:`median_ratio`)."""
    return (f"{statistics.median(times[baseline]) * 1e3:.1f} | {statistics.median(times[variant]) * 1e3:.1f} | "
            f"{median_ratio(times[variant], times[baseline]):.2f}")
