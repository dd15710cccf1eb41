#!/usr/bin/env python3
"""Sliding-window attention vs full causal attention at the same shape (forward + backward), on this machine.

    python scripts/performance/window_attention.py [--batch 2] [--heads 8] [--kv-heads 4] [--head-dim 64] [--rounds 3]

For each (sequence length, window) of the grid, times ``megatron_bridge.models.attention.causal_attention`` with the
window and without it, interleaved in each round (this machine is shared and noisy), and prints the median times and
their ratio (window / full) together with the ratio of attended keys the FLOP count uses (``min(W, s)`` per query
against ``s``). Also checks that the windowed output equals the band-masked reference within 1e-5.
"""

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path


GRID = ((512, 64), (1024, 128), (2048, 128), (2048, 256), (2048, 512), (2048, 1024), (4096, 512))
"""(sequence length, window) pairs timed."""


def parse_args() -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--steps", type=int, default=3, help="forward+backward passes per variant and round")
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
          f"head dim {args.head_dim}")
    print("| seq | window | full (ms) | window (ms) | time ratio | attended-key ratio |")
    print("|---|---|---|---|---|---|")
    for s, w in GRID:
        q = torch.randn(args.batch, args.heads, s, args.head_dim, requires_grad=True)
        k, v = (torch.randn(args.batch, args.kv_heads, s, args.head_dim, requires_grad=True) for _ in range(2))
        pos = torch.arange(s)
        reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=band_mask(pos, pos, w),
                                                                     enable_gqa=True)
        torch.testing.assert_close(causal_attention(q, k, v, w), reference, atol=1e-5, rtol=1e-5)
        times: dict[int | None, list[float]] = {None: [], w: []}
        for _ in range(args.rounds):
            for window in (None, w):
                start = time.perf_counter()
                for _ in range(args.steps):
                    causal_attention(q, k, v, window).sum().backward()
                times[window].append((time.perf_counter() - start) / args.steps)
        full, windowed = statistics.median(times[None]), statistics.median(times[w])
        print(f"| {s} | {w} | {full * 1e3:.1f} | {windowed * 1e3:.1f} | {windowed / full:.2f} | {min(w, s) / s:.2f} |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
