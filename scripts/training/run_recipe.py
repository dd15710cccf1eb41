#!/usr/bin/env python3
"""Train any recipe: ``python scripts/training/run_recipe.py --recipe tiny_llama [--nproc 2] [key=value ...]``.

Precedence: recipe defaults < ``--config-file`` YAML < trailing ``key=value`` overrides. Errors: one line and exit
code 2 for a user error (``--debug`` shows the traceback); see docs/troubleshooting.md. ``--corpus`` trains on the
shipped text corpus (tokenized into ``--data-cache`` on first use). ``--dry-run`` prints the validated YAML and the
per-rank memory/FLOPs estimate (against ``profiling.estimate_gpu``) as YAML comments, and exits.
"""

import argparse
import os
import sys

from megatron_bridge.launcher.nodes import add_node_arguments, node_layout
from megatron_bridge.perf.args import positive_int
from megatron_bridge.recipes import RECIPES, get_recipe


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments; trailing key=value pairs land in ``overrides``."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--recipe", required=True, help=f"one of {sorted(RECIPES)}")
    p.add_argument("--config-file", default=None, help="YAML file merged over the recipe")
    p.add_argument("--nproc", type=positive_int, default=1,
                   help="processes to launch on this machine (torchrun), >= 1; with --nnodes N, on each node")
    p.add_argument("--dir", default=None, help="run folder: checkpoints and TensorBoard logs go here")
    p.add_argument("--corpus", action="store_true", help="train on the shipped text corpus (byte tokenizer)")
    p.add_argument("--data-cache", default="runs/data_cache", help="where the tokenized corpus is cached")
    p.add_argument("--dry-run", action="store_true", help="print the validated YAML and the memory estimate; exit")
    p.add_argument("--debug", action="store_true", help="print tracebacks of errors (or MEGATRON_BRIDGE_DEBUG=1)")
    add_node_arguments(p)
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.train_iters=10")
    return p.parse_intermixed_args(argv)  # flags anywhere, also between the key=value overrides


def build_config(args: argparse.Namespace):  # noqa: ANN201  (ConfigContainer; keep the script import-light)
    """Recipe → YAML → CLI overrides."""
    if args.dir is not None:
        from megatron_bridge.utils.paths import check_output_path

        check_output_path(args.dir, "--dir")
    cfg = get_recipe(args.recipe).fn(dir=args.dir)
    if args.corpus:
        from megatron_bridge.data.corpus import ensure_corpus_indexed
        prefix = ensure_corpus_indexed(args.data_cache, cfg.tokenizer)
        cfg.dataset.mock, cfg.dataset.data_path = False, [prefix]
    return cfg.apply_overrides(args.config_file, args.overrides)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = parse_args(argv)
    from megatron_bridge.launcher.local import relaunch_with_torchrun
    from megatron_bridge.utils.launch import finish_worker, running_under_torchrun

    layout = node_layout(args)
    world_size = layout.world_size(args.nproc)
    if layout.needs_launcher(args.nproc) and not running_under_torchrun() and not args.dry_run:
        import logging

        logging.getLogger("megatron_bridge").setLevel(logging.ERROR)  # the ranks log the adjustments themselves
        build_config(args).validate(world_size=world_size)  # config errors once, before any rank starts
        return relaunch_with_torchrun(args.nproc, [os.path.abspath(__file__), *_without_nproc(sys.argv[1:])],
                                      layout=layout)
    cfg = build_config(args)
    if args.dry_run:
        from megatron_bridge.perf.estimate import dry_run_report

        cfg.validate(world_size=world_size)
        print(cfg.to_yaml(), end="")
        print(dry_run_report(cfg, world_size), end="")
        return 0
    from megatron_bridge.training.pretrain import pretrain

    result = pretrain(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        losses = result.losses
        trained = "trained 0 steps"
        if losses:
            trained = f"trained {len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}"
        median = sorted(result.step_times)[len(result.step_times) // 2] if result.step_times else 0.0
        print(f"done: at step {result.final_step} ({result.exit_reason}); this run {trained}; "
              f"median step {median:.3f}s")
    return finish_worker(0)


def _without_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--nproc":
            skip = True
            continue
        if a.startswith("--nproc="):
            continue
        out.append(a)
    return out


if __name__ == "__main__":
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
