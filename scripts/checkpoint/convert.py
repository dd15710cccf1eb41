#!/usr/bin/env python3
"""Convert checkpoint weights: a checkpoint (any format) or weights file → one ``torch`` file or a Hugging Face
Llama folder, and a Hugging Face folder → a ``torch`` file. Runs in one process, no GPU needed. Examples::

    # latest checkpoint of a run -> HF folder (model.safetensors + config.json, vocabulary unpadded)
    python scripts/checkpoint/convert.py runs/tiny/checkpoints out/hf --to hf
    # a given step -> one torch file ({"model": {name: tensor}})
    python scripts/checkpoint/convert.py runs/tiny/checkpoints out/weights.pt --to torch --step 200
    # HF folder -> torch file (vocabulary padded as the model config says)
    python scripts/checkpoint/convert.py out/hf out/from_hf.pt --to torch

Every output loads as ``checkpoint.pretrained_checkpoint`` (HF folders too).
"""

import argparse
import sys

from megatron_bridge.checkpoint.convert import convert_weights
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.errors import MegatronBridgeError
from megatron_bridge.utils.logging import setup_logging


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", help="checkpoint root, iter_NNNNNNN folder, weights file (.pt) or HF folder")
    p.add_argument("dst", help="output file (--to torch) or folder (--to hf)")
    p.add_argument("--to", choices=("torch", "hf"), required=True, help="output kind")
    p.add_argument("--step", type=int, default=None, help="step of a checkpoint root (default: the latest)")
    p.add_argument("--config", default=None,
                   help="run_config.yaml giving the model config (HF export of a weights file)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the conversion; returns the exit status."""
    args = parse_args(argv)
    setup_logging("WARNING")
    try:
        model_config = ConfigContainer.from_yaml(args.config).model if args.config else None
        out = convert_weights(args.src, args.dst, args.to, step=args.step, model_config=model_config)
    except MegatronBridgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
