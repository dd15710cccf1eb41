#!/usr/bin/env python3
"""Convert weights between our checkpoints, one torch file and Hugging Face folders (the Bridge). One process, no
GPU, one tensor at a time; an output folder appears complete or not at all. Examples::

    # Hugging Face folder (Llama 3/3.1/3.2, Qwen3; safetensors single/sharded or pytorch_model.bin) -> our
    # checkpoint (torch_dist, step 0): train from it with checkpoint.pretrained_checkpoint=ckpts/llama or resume
    python scripts/checkpoint/convert.py hf/Llama-3.2-1B ckpts/llama --to megatron
    # latest checkpoint of a run (any format, backend, world size) -> HF folder, bf16, 2 GB shards
    python scripts/checkpoint/convert.py runs/tiny/checkpoints out/hf --to hf --dtype bfloat16 --max-shard-size 2GB
    # ... taking tokenizer files and token ids from the original HF folder, writing the transformers 4.x format
    python scripts/checkpoint/convert.py runs/tiny/checkpoints out/hf --to hf --hf-source hf/Llama-3.2-1B \\
        --rope-format rope_scaling
    # a given step -> one torch file ({"model": {name: tensor}})
    python scripts/checkpoint/convert.py runs/tiny/checkpoints out/weights.pt --to torch --step 200
    # a weights file -> HF folder (the model config comes from a run_config.yaml)
    python scripts/checkpoint/convert.py out/weights.pt out/hf --to hf --config runs/tiny/run_config.yaml
    # HF folder -> HF folder (reshard, change dtype) and HF folder -> torch file
    python scripts/checkpoint/convert.py hf/Qwen3-0.6B out/qwen3 --to hf --max-shard-size 500MB
    python scripts/checkpoint/convert.py out/hf out/from_hf.pt --to torch
    # between the engines: any source -> a megatron-core torch_dist checkpoint (model.engine=megatron_core), and a
    # megatron-core checkpoint (ours; Megatron-Bridge's or Megatron-LM's with --config) -> our native checkpoint
    python scripts/checkpoint/convert.py runs/tiny/checkpoints ckpts/mcore --to megatron_core
    python scripts/checkpoint/convert.py ckpts/mcore ckpts/native --to megatron

Every output loads as ``checkpoint.pretrained_checkpoint`` (HF folders are checked against cfg.model first).
Bad input (missing files, truncated shards, mismatched shapes, unknown tensors or config keys, an unknown
architecture or rope_type) exits with status 2 and a one-line error; no partial output is left behind.
"""

import argparse
import sys

from megatron_bridge.bridge.targets import TARGETS  # torch-free: --help and argument errors come at once
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.utils.logging import setup_logging


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", help="checkpoint root, iter_NNNNNNN folder, weights file (.pt) or HF folder")
    p.add_argument("dst", help="output file (--to torch) or folder (--to hf, megatron, megatron_core)")
    p.add_argument("--to", choices=TARGETS, required=True,
                   help="torch: one weights file; hf: a Hugging Face folder; megatron: our native checkpoint (from "
                        "HF or megatron-core); megatron_core: a megatron-core torch_dist checkpoint")
    p.add_argument("--step", type=int, default=None, help="step of a checkpoint root (default: the latest)")
    p.add_argument("--config", default=None,
                   help="run_config.yaml giving the model config (HF export of a weights file)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="dtype of the written weights (default: the source's)")
    p.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard of an HF output (e.g. 500MB)")
    p.add_argument("--hf-source", default=None,
                   help="HF folder whose tokenizer files, generation config and token ids an HF export carries")
    p.add_argument("--rope-format", choices=("rope_parameters", "rope_scaling"), default=None,
                   help="config.json RoPE format: transformers >= 5 (rope_parameters) or 4.x (rope_scaling); "
                        "default: the source's, else rope_parameters")
    p.add_argument("--family", default=None, help="HF model family of an export (default: detected), e.g. llama")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output (file or folder)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the conversion; returns the exit status."""
    args = parse_args(argv)
    setup_logging("WARNING")
    from megatron_bridge.bridge.convert import convert_weights
    from megatron_bridge.utils.paths import check_output_path

    check_output_path(args.dst, "dst", folder=args.to != "torch")
    options = {"weight_dtype": args.dtype, "max_shard_size": args.max_shard_size, "overwrite": args.overwrite,
               "rope_format": args.rope_format}
    if args.hf_source:
        options["source_path"] = args.hf_source
    if args.family:
        options["family"] = args.family
    model_config = ConfigContainer.from_yaml(args.config).model if args.config else None
    hf_options = options if args.to in ("hf", "megatron") else {"overwrite": args.overwrite}
    out = convert_weights(args.src, args.dst, args.to, step=args.step, model_config=model_config, **hf_options)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
