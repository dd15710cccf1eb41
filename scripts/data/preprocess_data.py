#!/usr/bin/env python3
"""Tokenize a JSONL file (one document per line) into Megatron indexed datasets.

Writes ``<output-prefix>_<key>_document.bin/.idx`` for every json key, the format Megatron-LM's
``tools/preprocess_data.py`` writes. Example::

    python scripts/data/preprocess_data.py --input data/corpus/tiny_encyclopedia.jsonl \\
        --output-prefix out/corpus --tokenizer-type byte --append-eod
    # -> out/corpus_text_document.bin/.idx; train on it with
    #    dataset.mock=False dataset.data_path=[out/corpus_text_document]
"""

import argparse
import signal
import sys
from types import FrameType

from megatron_bridge.config.data import TokenizerConfig
from megatron_bridge.data.preprocess import preprocess_jsonl
from megatron_bridge.utils.logging import setup_logging


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="JSONL file, one JSON object per line")
    p.add_argument("--output-prefix", required=True, help="writes <prefix>_<key>_document.bin/.idx")
    p.add_argument("--tokenizer-type", choices=("byte", "huggingface"), default="byte")
    p.add_argument("--tokenizer-file", default=None, help="tokenizer.json for --tokenizer-type huggingface")
    p.add_argument("--eod-token", default=None, help="end-of-document token of the tokenizer.json, if unusual")
    p.add_argument("--json-keys", nargs="+", default=["text"], help="keys whose strings are tokenized")
    p.add_argument("--append-eod", action="store_true", help="append the end-of-document token to every document")
    p.add_argument("--workers", type=int, default=1, help="tokenizer processes")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing dataset at the output prefix (the new one is renamed in when complete)")
    return p.parse_args(argv)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    """Run the tool; returns the exit status."""
    args = parse_args(argv)
    setup_logging("WARNING")
    signal.signal(signal.SIGTERM, _interrupt)  # end like Ctrl-C: the temporary outputs are removed
    cfg = TokenizerConfig(
        tokenizer_type=args.tokenizer_type, tokenizer_file=args.tokenizer_file, eod_token=args.eod_token
    )
    summary = preprocess_jsonl(
        args.input,
        args.output_prefix,
        cfg,
        json_keys=args.json_keys,
        append_eod=args.append_eod,
        workers=args.workers,
        overwrite=args.overwrite,
    )
    for key, prefix in summary.output_prefixes.items():
        print(f"{key}: {prefix}.bin / {prefix}.idx")
    print(f"docs={summary.documents} tokens={summary.tokens} seconds={summary.seconds:.2f}")
    return 0


if __name__ == "__main__":
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
