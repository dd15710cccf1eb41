#!/usr/bin/env python3
"""Soft-capped attention (Gemma 2) vs plain causal attention at the same shape (forward + backward), on this machine.

    python scripts/performance/softcap_attention.py [--batch 2] [--heads 8] [--kv-heads 4] [--head-dim 64] [--rounds 3]

For each (sequence length, window) of the grid, times ``megatron_bridge.models.attention.causal_attention`` with
``softcap=50`` (the blockwise path of ``models/softcapping.py``) and without it (SDPA), interleaved in each round
(this machine is shared and noisy), and prints the median times and their ratio. Also checks the capped output
against transformers' Gemma 2 formula written out (scores ``cap · tanh(s / cap)``, masked, fp32 softmax) within 1e-5.
"""

import argparse
import sys
from pathlib import Path

from _attention_bench import attention_parser, interleaved, pair_cells, qkv, setup


GRID = ((1024, None), (1024, 128), (2048, None), (2048, 256))
"""(sequence length, window or None for full causal) pairs timed."""
CAP = 50.0
"""Gemma 2's attention cap."""


def parse_args() -> argparse.Namespace:
    """Command line."""
    return attention_parser(__doc__, kv_heads=4, steps=2, rounds=3).parse_args()


def main() -> int:
    """Entry point."""
    args = parse_args()
    torch = setup(args, f", cap {CAP}")
    from megatron_bridge.models.attention import band_mask, causal_attention

    print("| seq | window | plain (ms) | soft-capped (ms) | time ratio |")
    print("|---|---|---|---|---|")
    for s, w in GRID:
        q, k, v = qkv(args, s)
        with torch.no_grad():
            pos, groups = torch.arange(s), args.heads // args.kv_heads
            k_r, v_r = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
            scores = torch.tanh(q @ k_r.transpose(-1, -2) * args.head_dim**-0.5 / CAP) * CAP
            scores = scores.masked_fill(~band_mask(pos, pos, w), float("-inf"))
            torch.testing.assert_close(causal_attention(q, k, v, w, softcap=CAP), scores.softmax(-1) @ v_r,
                                       atol=1e-5, rtol=1e-5)
        times = interleaved({"plain": lambda: causal_attention(q, k, v, w).sum().backward(),  # noqa: B023
                             "capped": lambda: causal_attention(q, k, v, w, softcap=CAP).sum().backward()},  # noqa: B023
                            args.rounds, args.steps)
        print(f"| {s} | {w or 'full'} | {pair_cells(times, 'plain', 'capped')} |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
