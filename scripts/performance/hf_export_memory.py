#!/usr/bin/env python3
"""Peak memory of exporting one of our checkpoints to a HF folder, for several shard sizes.

    python scripts/performance/hf_export_memory.py [--layers 28] [--hidden 1024] [--ffn 4096] [--vocab 32000]
                                                   [--shard_sizes 5GB 200MB]

A Llama-style model of the given size (default: ~0.5 B parameters, float32, 2 GB) is written once as a
``torch_dist`` checkpoint with random weights (streamed, as ``import_ckpt`` writes). Then, for each shard size, a
fresh process runs ``AutoBridge.export_ckpt`` and reports its peak RSS above its RSS just before the export
(``ru_maxrss`` minus ``/proc/self/statm``), the wall time and the files written. Numbers go to
docs/training/hf-conversion.md.
"""

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


GIB = 1024**3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--shard_sizes", nargs="+", default=["5GB", "200MB"])
    p.add_argument("--workdir", default=None, help="where the checkpoint and exports go (default: a temp folder)")
    p.add_argument("--worker", nargs=3, metavar=("CKPT", "OUT", "SHARD"), default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def model_config(args: argparse.Namespace):  # noqa: ANN201  (a ModelConfig)
    """The measured model: the tiny Llama recipe's model at the requested size, float32."""
    from megatron_bridge.recipes.tiny import tiny_llama_pretrain_config

    config = tiny_llama_pretrain_config().model
    config.num_layers, config.hidden_size, config.ffn_hidden_size = args.layers, args.hidden, args.ffn
    config.num_attention_heads, config.num_query_groups = args.hidden // 64, args.hidden // 128
    config.vocab_size, config.params_dtype = args.vocab, "float32"
    config.share_embeddings_and_output_weights = False
    return config


def write_checkpoint(args: argparse.Namespace, root: Path) -> int:
    """A step-0 checkpoint of random weights; returns its parameter count."""
    import torch

    from megatron_bridge.bridge.checkpoints import write_streaming_checkpoint
    from megatron_bridge.bridge.weights import expected_shapes
    from megatron_bridge.config.container import ConfigContainer

    config = model_config(args)
    shapes = expected_shapes(config)
    cfg = ConfigContainer(model=config)
    write_streaming_checkpoint(root, cfg, {n: (s, torch.float32) for n, s in shapes.items()},
                               lambda name: torch.randn(shapes[name]))
    return sum(torch.Size(s).numel() for s in shapes.values())


def worker(ckpt: str, out: str, shard: str) -> None:
    """Export ``ckpt`` to ``out`` with ``shard``-sized shards; print the measurement as JSON."""
    from megatron_bridge import AutoBridge

    rss = int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
    start = time.perf_counter()
    AutoBridge.export_ckpt(ckpt, out, max_shard_size=shard)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    files = sorted(p.name for p in Path(out).glob("*.safetensors"))
    print(json.dumps({"shard": shard, "growth_gib": (peak - rss) / GIB, "seconds": seconds, "files": len(files)}))


def main(argv: list[str] | None = None) -> int:
    """Write the checkpoint, export it once per shard size in a fresh process, print a table."""
    args = parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    work = Path(args.workdir or tempfile.mkdtemp(prefix="hf_export_memory_"))
    try:
        params = write_checkpoint(args, work / "ckpt")
        print(f"model: {params / 1e9:.3f} B parameters, {params * 4 / GIB:.2f} GiB float32")
        print("| max_shard_size | safetensors files | peak RSS growth (GiB) | seconds |")
        print("|---|---|---|---|")
        for shard in args.shard_sizes:
            out = work / f"out-{shard}"
            result = subprocess.run([sys.executable, __file__, "--worker", str(work / "ckpt"), str(out), shard],
                                    capture_output=True, text=True, check=True)
            row = json.loads(result.stdout.strip().splitlines()[-1])
            print(f"| {shard} | {row['files']} | {row['growth_gib']:.2f} | {row['seconds']:.1f} |")
            shutil.rmtree(out, ignore_errors=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
