#!/usr/bin/env python3
"""Soft-capped attention (Gemma 2) vs plain causal attention at the same shape (forward + backward), on this machine.

    python scripts/performance/softcap_attention.py [--batch 2] [--heads 8] [--kv-heads 4] [--head-dim 64] [--rounds 3]

For each (sequence length, window) of the grid, times ``megatron_bridge.models.attention.causal_attention`` with
``softcap=50`` (the explicit-score path of ``models/softcapping.py``) and without it (SDPA), interleaved in each round
(this machine is shared and noisy), and prints the median times and their ratio. Also checks the capped output
against transformers' Gemma 2 formula written out (scores ``cap · tanh(s / cap)``, masked, fp32 softmax) within 1e-5.
"""

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path


GRID = ((1024, None), (1024, 128), (2048, None), (2048, 256))
"""(sequence length, window or None for full causal) pairs timed."""
CAP = 50.0
"""Gemma 2's attention cap."""


def parse_args() -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--steps", type=int, default=2, help="forward+backward passes per variant and round")
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args()


def main() -> int:
    """Entry point."""
    args = parse_args()
    import torch

    from megatron_bridge.models.attention import band_mask, causal_attention

    torch.manual_seed(0)
    print(f"# {datetime.date.today()} {platform.machine()} torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; batch {args.batch}, heads {args.heads}/{args.kv_heads}, "
          f"head dim {args.head_dim}, cap {CAP}")
    print("| seq | window | plain (ms) | soft-capped (ms) | time ratio |")
    print("|---|---|---|---|---|")
    for s, w in GRID:
        q = torch.randn(args.batch, args.heads, s, args.head_dim, requires_grad=True)
        k, v = (torch.randn(args.batch, args.kv_heads, s, args.head_dim, requires_grad=True) for _ in range(2))
        with torch.no_grad():
            pos, groups = torch.arange(s), args.heads // args.kv_heads
            k_r, v_r = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
            scores = torch.tanh(q @ k_r.transpose(-1, -2) * args.head_dim**-0.5 / CAP) * CAP
            scores = scores.masked_fill(~band_mask(pos, pos, w), float("-inf"))
            torch.testing.assert_close(causal_attention(q, k, v, w, softcap=CAP), scores.softmax(-1) @ v_r,
                                       atol=1e-5, rtol=1e-5)
        times: dict[float | None, list[float]] = {None: [], CAP: []}
        for _ in range(args.rounds):
            for cap in (None, CAP):
                start = time.perf_counter()
                for _ in range(args.steps):
                    causal_attention(q, k, v, w, softcap=cap).sum().backward()
                times[cap].append((time.perf_counter() - start) / args.steps)
        plain, capped = statistics.median(times[None]), statistics.median(times[CAP])
        print(f"| {s} | {w or 'full'} | {plain * 1e3:.1f} | {capped * 1e3:.1f} | {capped / plain:.2f} |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
