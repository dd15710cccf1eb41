#!/usr/bin/env python3
"""Attention with sinks (``model.softmax_type``) vs the same attention without them, on this machine's CPU.

    python scripts/performance/sink_attention.py [--batch 2] [--heads 8] [--kv-heads 8] [--head-dim 64] [--rounds 11]

For each (sequence length, window) of the grid, times ``megatron_bridge.models.attention.causal_attention`` without
sinks ("plain"), with them (the fused path of ``megatron_bridge.models.attention_sinks``) and, for comparison, the
explicit sink-column path it replaced on CPU (``sdpa_with_sink_column``), forward only (no grad) and forward +
backward, the variants interleaved in each round (this machine is shared and noisy), on one thread. Prints the
median times and the ratios sink / plain and column / plain, each the median over the rounds of that round's ratio
(a round's variants ran back to back, under about the same load). Checks first that the fused output equals the
column path's within 1e-5.
"""

import argparse
import datetime
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path


GRID = ((1024, None), (2048, None), (2048, 512))
"""(sequence length, window) pairs timed; None = full causal attention."""


def parse_args() -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--steps", type=int, default=1, help="passes per variant, mode and round")
    p.add_argument("--rounds", type=int, default=11)
    return p.parse_args()


def _variants(window: int | None, sinks: "object") -> dict[str, Callable]:
    """name → ``f(q, k, v)``: plain, fused sinks, and the sink column (the shared attention with its sink function
    swapped for the column, during the call only)."""
    from unittest import mock

    import torch

    from megatron_bridge.models.attention import causal_attention
    from megatron_bridge.models.attention_sinks import sdpa_with_sink_column

    def column_sink(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                    sinks: torch.Tensor, gqa: bool) -> torch.Tensor:
        if mask is None:  # plain causal
            mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
        return sdpa_with_sink_column(q, k, v, mask, sinks, gqa)

    def column(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with mock.patch("megatron_bridge.models.attention.sdpa_with_sink", column_sink):
            return causal_attention(q, k, v, window, sinks=sinks)

    return {"plain": lambda q, k, v: causal_attention(q, k, v, window),
            "sink": lambda q, k, v: causal_attention(q, k, v, window, sinks=sinks),
            "column": column}


def _time(fn: Callable, tensors: tuple, backward: bool, steps: int) -> float:
    """Seconds per pass of ``fn`` (forward without grad, or forward + backward)."""
    import torch

    start = time.perf_counter()
    for _ in range(steps):
        if backward:
            fn(*tensors).sum().backward()
        else:
            with torch.no_grad():
                fn(*tensors)
    return (time.perf_counter() - start) / steps


def main() -> int:
    """Entry point."""
    args = parse_args()
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"# {datetime.date.today()} {platform.machine()} torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread; batch {args.batch}, heads {args.heads}/{args.kv_heads}, "
          f"head dim {args.head_dim}; {args.rounds} rounds x {args.steps} passes, medians")
    print("| seq | window | plain fwd (ms) | sink fwd (ms) | sink / plain fwd | column / plain fwd "
          "| plain fwd+bwd (ms) | sink fwd+bwd (ms) | sink / plain fwd+bwd | column / plain fwd+bwd |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s, w in GRID:
        q = torch.randn(args.batch, args.heads, s, args.head_dim, requires_grad=True)
        k, v = (torch.randn(args.batch, args.kv_heads, s, args.head_dim, requires_grad=True) for _ in range(2))
        sinks = torch.randn(args.heads, requires_grad=True)
        variants = _variants(w, sinks)
        with torch.no_grad():
            torch.testing.assert_close(variants["sink"](q, k, v), variants["column"](q, k, v), atol=1e-5, rtol=1e-5)
        times = {(name, bwd): [] for name in variants for bwd in (False, True)}
        for _ in range(args.rounds):
            for bwd in (False, True):
                for name, fn in variants.items():
                    times[name, bwd].append(_time(fn, (q, k, v), bwd, args.steps))
        med = {key: statistics.median(t) for key, t in times.items()}
        cells = []
        for bwd in (False, True):
            ratio = {name: statistics.median(a / b for a, b in zip(times[name, bwd], times["plain", bwd], strict=True))
                     for name in ("sink", "column")}
            cells += [f"{med['plain', bwd] * 1e3:.1f}", f"{med['sink', bwd] * 1e3:.1f}", f"{ratio['sink']:.2f}",
                      f"{ratio['column']:.2f}"]
        print(f"| {s} | {w or 'none'} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
