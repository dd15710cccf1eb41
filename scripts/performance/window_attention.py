#!/usr/bin/env python3
"""Sliding-window attention vs full causal attention at the same shape (forward + backward), on this machine.

    python scripts/performance/window_attention.py [--batch 2] [--heads 8] [--kv-heads 4] [--head-dim 64] [--rounds 3]

For each (sequence length, window) of the grid, times ``megatron_bridge.models.attention.causal_attention`` with the
window and without it, interleaved in each round (this machine is shared and noisy), and prints the median times and
their ratio (window / full) together with the ratio of attended keys the FLOP count uses (``min(W, s)`` per query
against ``s``). Also checks that the windowed output equals the band-masked reference within 1e-5.
"""

import argparse
import sys
from pathlib import Path

from _attention_bench import attention_parser, interleaved, pair_cells, qkv, setup


GRID = ((512, 64), (1024, 128), (2048, 128), (2048, 256), (2048, 512), (2048, 1024), (4096, 512))
"""(sequence length, window) pairs timed."""


def parse_args() -> argparse.Namespace:
    """Command line."""
    return attention_parser(__doc__, kv_heads=4, steps=3, rounds=3).parse_args()


def main() -> int:
    """Entry point."""
    args = parse_args()
    torch = setup(args)
    from megatron_bridge.models.attention import band_mask, causal_attention

    print("| seq | window | full (ms) | window (ms) | time ratio | attended-key ratio |")
    print("|---|---|---|---|---|---|")
    for s, w in GRID:
        q, k, v = qkv(args, s)
        pos = torch.arange(s)
        reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=band_mask(pos, pos, w),
                                                                     enable_gqa=True)
        torch.testing.assert_close(causal_attention(q, k, v, w), reference, atol=1e-5, rtol=1e-5)
        times = interleaved({"full": lambda: causal_attention(q, k, v, None).sum().backward(),  # noqa: B023
                             "window": lambda: causal_attention(q, k, v, w).sum().backward()},  # noqa: B023
                            args.rounds, args.steps)
        print(f"| {s} | {w} | {pair_cells(times, 'full', 'window')} | {min(w, s) / s:.2f} |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
