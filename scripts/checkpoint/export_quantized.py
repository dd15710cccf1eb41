#!/usr/bin/env python3
"""Export a quantization-aware-trained checkpoint (``quantization.quant_cfg`` set) as one modelopt file
(``modelopt.torch.opt.save``: modelopt state + weights + calibrated scales). Runs in one process on CPU::

    python scripts/checkpoint/export_quantized.py runs/qat/checkpoints out/qat_modelopt.pth
    python scripts/checkpoint/export_quantized.py runs/qat/checkpoints out/qat_modelopt.pth --step 200

Restore it with ``megatron_bridge.optimization.export.restore_exported(model_config, path)``
(see docs/training/model-optimization.md).
"""

import argparse
import sys

from megatron_bridge.utils.cli import run_cli
from megatron_bridge.utils.logging import setup_logging


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="checkpoint root or iter_NNNNNNN folder of a quantized run")
    p.add_argument("output", help="output file")
    p.add_argument("--step", type=int, default=None, help="step of a checkpoint root (default: the latest)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the export; returns the exit status (project errors become one line and exit 2 through run_cli)."""
    args = parse_args(argv)
    setup_logging("WARNING")
    from megatron_bridge.optimization.export import export_modelopt

    out = export_modelopt(args.checkpoint, args.output, step=args.step)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
