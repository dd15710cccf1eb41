"""Command-line flags of the performance launcher and how they turn into a config.

Precedence (one rule, documented in docs/performance.md): recipe defaults < perf overrides < flags < trailing
``key=value`` overrides.
"""

import argparse
from typing import Any

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.recipes import RECIPES, get_recipe
from megatron_bridge.recipes.perf import common_perf_overrides, megatron_fsdp_overrides


_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}
COMPUTE_DTYPES = {"bf16": "bf16_mixed", "fp16": "fp16_mixed", "fp32": "fp32"}
FP8_DTYPES = ("fp8_cs", "fp8_mx", "fp8_sc", "nvfp4")


def bool_arg(value: str | bool) -> bool:
    """Parse true/false/1/0/yes/no (any case)."""
    if isinstance(value, bool):
        return value
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false/1/0/yes/no), got {value!r}")


def build_parser() -> argparse.ArgumentParser:
    """The launcher's argument parser (Megatron-Bridge's flag names)."""
    p = argparse.ArgumentParser(prog="launch.py", description="Megatron-Bridge-style performance runs.")
    what = p.add_argument_group("what to run")
    what.add_argument("--recipe", default=None, help=f"recipe name, one of {sorted(RECIPES)}")
    what.add_argument("-m", "--model", "--model_family_name", dest="model", default=None,
                      help="model family, e.g. llama3, llama31, llama32, qwen3 (with --size)")
    what.add_argument("-s", "--size", default=None, help="model size, e.g. 8b, 70b, 600m (with --model)")
    what.add_argument("-g", "--gpu", default=None, help="GPU type the dry-run estimate is checked against (h100, "
                      "h200, b200, gb200, a100, ...); default: profiling.estimate_gpu, else h100")
    what.add_argument("-ng", "--num_gpus", type=int, default=1, help="processes (GPUs, or CPU ranks on gloo)")
    par = p.add_argument_group("parallelism and batch")
    for short, long, help_ in (("-tp", "--tensor_model_parallel_size", "TP"),
                               ("-pp", "--pipeline_model_parallel_size", "PP"),
                               ("-cp", "--context_parallel_size", "CP"),
                               ("-vp", "--virtual_pipeline_model_parallel_size", "VP"),
                               ("-gb", "--global_batch_size", "global batch size"),
                               ("-mb", "--micro_batch_size", "micro batch size"),
                               ("-sl", "--seq_length", "sequence length"),
                               ("-ms", "--max_steps", "training steps")):
        par.add_argument(short, long, type=int, default=None, help=help_)
    feat = p.add_argument_group("features")
    feat.add_argument("--use_megatron_fsdp", type=bool_arg, default=False, help="Megatron FSDP (true/false)")
    feat.add_argument("--use_torch_fsdp2", type=bool_arg, default=False, help="PyTorch FSDP2 (true/false)")
    feat.add_argument("-c", "--compute_dtype", default=None, choices=[*COMPUTE_DTYPES, *FP8_DTYPES])
    feat.add_argument("--activation_checkpointing", type=bool_arg, default=False,
                      help="full activation recomputation of every block")
    feat.add_argument("--cpu_offloading", type=int, nargs="?", const=1, default=None,
                      help="offload activations of the first N blocks to CPU (default N=1)")
    feat.add_argument("--warmup_iters", type=int, default=10, help="LR warmup steps (clipped to max_steps - 1)")
    out = p.add_argument_group("output")
    out.add_argument("-d", "--dryrun", action="store_true", help="print the final YAML and exit without running")
    out.add_argument("--output_dir", default=None, help="where results.json and the plot go")
    out.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), help="print the ratio table of two runs")
    p.add_argument("overrides", nargs="*", help="key=value config overrides; they win over every flag")
    return p


def recipe_name(args: argparse.Namespace) -> str:
    """--recipe, else <model>_<size>, else llama3_8b."""
    if args.recipe:
        return args.recipe
    if args.model or args.size:
        if not (args.model and args.size):
            raise ConfigValidationError("--model and --size go together (e.g. --model llama3 --size 8b)")
        return f"{args.model}_{args.size}".lower()
    return "llama3_8b"


def _flag_values(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "tensor_model_parallel_size": args.tensor_model_parallel_size,
        "pipeline_model_parallel_size": args.pipeline_model_parallel_size,
        "context_parallel_size": args.context_parallel_size,
        "virtual_pipeline_model_parallel_size": args.virtual_pipeline_model_parallel_size,
        "global_batch_size": args.global_batch_size,
        "micro_batch_size": args.micro_batch_size,
        "seq_length": args.seq_length,
    }


def build_config(args: argparse.Namespace) -> ConfigContainer:
    """Recipe → perf overrides → flags → key=value overrides."""
    cfg = get_recipe(recipe_name(args)).fn(**{k: v for k, v in _flag_values(args).items() if v is not None})
    steps = args.max_steps if args.max_steps is not None else 50
    common_perf_overrides(cfg, train_iters=steps, warmup_iters=args.warmup_iters)
    if args.use_megatron_fsdp:
        megatron_fsdp_overrides(cfg)
    if args.use_torch_fsdp2:
        cfg.dist.use_torch_fsdp2 = True
    if args.compute_dtype in FP8_DTYPES:
        raise ConfigValidationError(
            f"--compute_dtype {args.compute_dtype} needs transformer-engine (model.transformer_impl="
            "'transformer_engine'), which this version does not wire; use bf16, fp16 or fp32", ("mixed_precision",))
    if args.compute_dtype:
        cfg.mixed_precision = COMPUTE_DTYPES[args.compute_dtype]
    if args.activation_checkpointing:
        cfg.model.recompute_granularity = "full"
    if args.cpu_offloading is not None:
        cfg.model.cpu_offloading = True
        cfg.model.cpu_offloading_num_layers = args.cpu_offloading
    return cfg.apply_overrides(overrides=args.overrides)
