#!/usr/bin/env python3
"""Step time of the two model engines on the same model, measured side by side in one run.

    python scripts/performance/engines.py [--steps 12] [--rounds 2] [--cpu-harness] [key=value ...]

Each round trains the tiny recipe (plus the ``key=value`` overrides) with ``model.engine="native"`` and then with
``model.engine="megatron_core"``, in this process, with the same model, batch, optimizer settings and data; rounds
interleave so machine noise hits both engines alike. The first ``--warmup`` steps of every run are dropped; each
engine's step time is the median over the kept steps of all rounds; the ratio is megatron-core / native. Prints one
line per engine and the ratio, and writes ``--out`` (JSON).

megatron-core needs CUDA. On a machine without it, ``--cpu-harness`` installs the test-only redirection of its CUDA
calls (tests/functional_tests/mcore_cpu_harness.py) so the comparison runs on CPU. Only megatron-core runs under
the harness's ``TorchFunctionMode`` (the native runs suspend it), which adds a Python call per torch operation: the
CPU ratio is pessimistic for megatron-core and compares the engines' structure, not GPU kernels.
"""

import argparse
import json
import os
import statistics
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]


def parse_args() -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=12, help="steps per run")
    p.add_argument("--warmup", type=int, default=3, help="steps dropped at the start of every run")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--cpu-harness", action="store_true",
                   help="redirect megatron-core's CUDA calls to the CPU (test-only harness; machines without CUDA)")
    p.add_argument("--out", default="runs/perf/engines.json")
    p.add_argument("overrides", nargs="*")
    return p.parse_args()


def make_config(args: argparse.Namespace, engine: str):  # noqa: ANN201
    """The tiny recipe with benchmark settings (no eval, no checkpoints) on ``engine``."""
    from megatron_bridge.recipes import tiny_llama_pretrain_config
    from megatron_bridge.recipes.perf import common_perf_overrides

    cfg = tiny_llama_pretrain_config()
    cfg = common_perf_overrides(cfg, train_iters=args.steps, warmup_iters=1)
    cfg.model.engine = engine
    cfg.checkpoint.save = cfg.checkpoint.load = None
    cfg.validation.eval_interval = None
    cfg.logger.log_progress = False
    return cfg.apply_overrides(None, args.overrides)


def main() -> int:
    """Run the rounds and print the comparison."""
    args = parse_args()
    sys.path.insert(0, str(REPO))
    if args.cpu_harness:
        from tests.functional_tests.mcore_cpu_harness import install

        install()
    from contextlib import nullcontext

    from megatron_bridge.training.pretrain import pretrain

    times: dict[str, list[float]] = {"native": [], "megatron_core": []}
    for _ in range(args.rounds):
        for engine in times:
            context = nullcontext()
            if args.cpu_harness and engine == "native":  # the native engine needs no redirection
                from tests.functional_tests.mcore_cpu_harness import suspended

                context = suspended()
            with context:
                result = pretrain(make_config(args, engine))
            times[engine] += result.step_times[args.warmup:]
    median = {engine: statistics.median(t) for engine, t in times.items()}
    ratio = median["megatron_core"] / median["native"]
    for engine, value in median.items():
        print(f"{engine:>14}: {value * 1e3:8.1f} ms/step (median of {len(times[engine])} steps)")
    print(f"megatron_core / native step time: {ratio:.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"median_s_per_step": median, "ratio_megatron_core_over_native": ratio,
                               "steps_per_engine": {k: len(v) for k, v in times.items()},
                               "cpu_harness": args.cpu_harness, "overrides": args.overrides,
                               "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}, indent=2))
    return 0


if __name__ == "__main__":
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
