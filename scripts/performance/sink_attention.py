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
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from _attention_bench import attention_parser, interleaved, median_ratio, qkv, setup


GRID = ((1024, None), (2048, None), (2048, 512))
"""(sequence length, window) pairs timed; None = full causal attention."""


def parse_args() -> argparse.Namespace:
    """Command line."""
    return attention_parser(__doc__, kv_heads=8, steps=1, rounds=11).parse_args()


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


def _pass(fn: Callable, tensors: tuple, backward: bool) -> Callable[[], object]:
    """One pass of ``fn``: forward without grad, or forward + backward."""
    import torch

    def run() -> object:
        if backward:
            return fn(*tensors).sum().backward()
        with torch.no_grad():
            return fn(*tensors)

    return run


def main() -> int:
    """Entry point."""
    args = parse_args()
    torch = setup(args)
    print("| seq | window | plain fwd (ms) | sink fwd (ms) | sink / plain fwd | column / plain fwd "
          "| plain fwd+bwd (ms) | sink fwd+bwd (ms) | sink / plain fwd+bwd | column / plain fwd+bwd |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s, w in GRID:
        q, k, v = qkv(args, s)
        sinks = torch.randn(args.heads, requires_grad=True)
        variants = _variants(w, sinks)
        with torch.no_grad():
            torch.testing.assert_close(variants["sink"](q, k, v), variants["column"](q, k, v), atol=1e-5, rtol=1e-5)
        modes = {False: "fwd", True: "fwd+bwd"}
        times = interleaved({f"{name} {mode}": _pass(fn, (q, k, v), bwd) for bwd, mode in modes.items()
                             for name, fn in variants.items()}, args.rounds, args.steps)
        cells = []
        for mode in modes.values():
            plain, sink = times[f"plain {mode}"], times[f"sink {mode}"]
            cells += [f"{statistics.median(plain) * 1e3:.1f}", f"{statistics.median(sink) * 1e3:.1f}",
                      f"{median_ratio(sink, plain):.2f}", f"{median_ratio(times[f'column {mode}'], plain):.2f}"]
        print(f"| {s} | {w or 'none'} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
