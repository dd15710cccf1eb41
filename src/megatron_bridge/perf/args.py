"""Command-line flags of the performance launcher (Megatron-Bridge's ``scripts/performance`` names) and how they turn
into a config. Every flag and its effect is in this one module: add a flag to :func:`build_parser` and apply it in
:func:`apply_flags`; ``-c`` values map to presets in :mod:`megatron_bridge.recipes.perf_configs`
(``COMPUTE_DTYPE_PRESETS``, ``precision_config``).

Precedence (Megatron-Bridge's default path, ``run_script.py``; docs/performance.md): recipe < per-GPU perf config
(``-g``) < benchmark defaults < trailing ``key=value`` overrides < flags. Then, unless ``-gb`` is given, the global
batch weak-scales with the data-parallel size when ``-ng`` differs from the GPU count the recipe or perf config is
laid out for.
"""

import argparse
from typing import Any

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.families import all_families, get_family, resolved_family
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.launcher.nodes import add_node_arguments
from megatron_bridge.launcher.slurm import add_slurm_arguments
from megatron_bridge.recipes import RECIPES, get_recipe
from megatron_bridge.recipes.perf import common_perf_overrides, megatron_fsdp_overrides
from megatron_bridge.recipes.perf_configs import (
    COMPUTE_DTYPE_PRESETS,
    PERF_PRESET_CHANGES,
    PerfConfig,
    get_perf_config,
    precision_config,
)
from megatron_bridge.utils.cli import bool_arg, positive_int


COMPUTE_DTYPES = tuple(COMPUTE_DTYPE_PRESETS)
"""``-c`` values: Megatron-Bridge's (bf16, fp8_cs, fp8_mx, fp8_sc, nvfp4) plus fp16 and fp32; each selects the preset
of :data:`~megatron_bridge.recipes.perf_configs.COMPUTE_DTYPE_PRESETS`."""
MODEL_FAMILIES = tuple(sorted({spec.perf_family for spec in all_families()}))
"""``-m`` values: Megatron-Bridge's performance families (each registered family's ``perf_family``: "qwen" for
Qwen3 and Qwen3-MoE)."""
GPUS = ("h100", "h200", "h20", "b200", "b300", "gb200", "gb300", "vr200", "r100", "a100", "l40s")
"""``-g`` values (Megatron-Bridge's GPU list plus the dry-run estimate's)."""
RECOMPUTE_MODULES = {"core_attn": "selective"}
"""``--recompute_modules`` entries this version recomputes, and the recompute_granularity they select."""
DEFAULT_STEPS = 50
"""Steps of a benchmark run without ``-ms`` (Megatron-Bridge's ``_benchmark_common``)."""


def optional_positive_int(value: str) -> int | None:
    """``None`` (the word) or an integer >= 1: ``-vp None`` as in Megatron-Bridge."""
    return None if value == "None" else positive_int(value)


VP_UNSET = -1
"""Default of ``-vp``: not given (``None`` is a value: no virtual pipeline)."""


def build_parser() -> argparse.ArgumentParser:
    """The launcher's argument parser. Abbreviated flags are refused (``allow_abbrev=False``)."""
    p = argparse.ArgumentParser(prog="launch.py", description="Megatron-Bridge-style performance runs.",
                                allow_abbrev=False)
    what = p.add_argument_group("what to run")
    what.add_argument("-m", "--model_family_name", type=str.lower, choices=MODEL_FAMILIES, default=None,
                      help=f"model family ({', '.join(MODEL_FAMILIES)}); checked against the recipe")
    what.add_argument("-mr", "--model_recipe_name", type=str.lower, default=None,
                      help=f"recipe, one of {sorted(RECIPES)} (default llama3_8b; tiny_llama on a machine "
                      "without GPUs)")
    what.add_argument("--recipe", default=None, help="same as -mr (this library's spelling)")
    what.add_argument("-g", "--gpu", type=str.lower, choices=GPUS, default=None,
                      help="GPU type: selects the per-GPU perf config when one is registered, and the dry-run "
                      "memory estimate's device")
    what.add_argument("-ng", "--num_gpus", type=positive_int, default=None,
                      help="processes of the whole job (GPUs, or CPU ranks); default: the smallest world size the "
                      "recipe's layout allows (PP x lcm(TP x CP, EP x ETP)) if this machine has that many")
    what.add_argument("-gn", "--gpus_per_node", type=positive_int, default=None,
                      help="processes per node (Megatron-Bridge's flag); -ng must be a multiple of it, the job spans "
                      "-ng / -gn nodes (default: all -ng on one node)")
    par = p.add_argument_group("parallelism and batch")
    for short, long, help_ in (("-tp", "--tensor_model_parallel_size", "TP (sets sequence parallel to TP > 1)"),
                               ("-pp", "--pipeline_model_parallel_size", "PP"),
                               ("-cp", "--context_parallel_size", "CP"),
                               ("-ep", "--expert_model_parallel_size", "EP"),
                               ("-gb", "--global_batch_size", "global batch size"),
                               ("-mb", "--micro_batch_size", "micro batch size"),
                               ("-sl", "--seq_length", "sequence length"),
                               ("-ms", "--max_steps", f"training steps (default {DEFAULT_STEPS})")):
        par.add_argument(short, long, type=positive_int, default=None, help=help_)
    par.add_argument("-vp", "--virtual_pipeline_model_parallel_size", type=optional_positive_int, default=VP_UNSET,
                     help="virtual pipeline stages per PP rank, or None")
    par.add_argument("-et", "--expert_tensor_parallel_size", type=optional_positive_int, nargs="?", const=None,
                     default=VP_UNSET, help="expert tensor-parallel size, or None (validate() names what is built)")
    feat = p.add_argument_group("features")
    feat.add_argument("-c", "--compute_dtype", default=None, choices=COMPUTE_DTYPES,
                      help="compute precision: bf16, fp16, fp32, fp8_cs (FP8 current scaling, every layer), fp8_mx "
                      "(MXFP8), fp8_sc (FP8 blockwise), nvfp4 (default: the recipe's; bf16 with -g)")
    feat.add_argument("--use_megatron_fsdp", type=bool_arg, default=None, help="Megatron FSDP (true/false)")
    feat.add_argument("--use_torch_fsdp2", type=bool_arg, default=None, help="PyTorch FSDP2 (true/false)")
    feat.add_argument("--recompute_modules", type=lambda s: [m for m in s.split(",") if m], default=None,
                      help=f"comma-separated modules to recompute ({', '.join(RECOMPUTE_MODULES)})")
    feat.add_argument("-rl", "--recompute_num_layers", type=positive_int, default=None,
                      help="full recompute of the first N blocks (recompute_method block)")
    feat.add_argument("-ol", "--activation_offload_layers", type=positive_int, default=None,
                      help="offload the activations of the first N blocks to CPU memory")
    feat.add_argument("--lr", type=float, default=None, help="peak learning rate")
    feat.add_argument("--min_lr", type=float, default=None, help="final learning rate")
    feat.add_argument("--warmup_iters", type=int, default=10, help="LR warmup steps (capped below the run length)")
    out = p.add_argument_group("output")
    out.add_argument("-d", "--dryrun", action="store_true",
                     help="print the final YAML and estimate (with -a/-p: the sbatch script); no run")
    out.add_argument("--output_dir", default=None, help="where results.json and the plot go")
    out.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), help="print the ratio table of two runs")
    add_node_arguments(p)
    add_slurm_arguments(p)
    p.add_argument("overrides", nargs="*", help="key=value config overrides (flags win over them)")
    return p


def recipe_name(args: argparse.Namespace) -> str:
    """``-mr`` (or ``--recipe``), else llama3_8b; ``-m`` must name the recipe's family."""
    if args.model_recipe_name and args.recipe and args.model_recipe_name != args.recipe:
        raise ConfigValidationError(f"-mr {args.model_recipe_name} and --recipe {args.recipe} disagree: give one")
    name = (args.model_recipe_name or args.recipe or "llama3_8b").removesuffix("_pretrain_config")
    get_recipe(name)  # unknown names: a named error listing the recipes
    family = args.model_family_name
    ours = recipe_perf_family(name) if family is not None else None
    if family is not None and ours != family:
        of_family = sorted(n for n in RECIPES if recipe_perf_family(n) == family)
        raise ConfigValidationError(f"-m {family} does not match the recipe {name!r} (-mr), a {ours!r} recipe: "
                                    f"recipes of family {family!r} are {of_family}")
    return name


def recipe_perf_family(name: str) -> str:
    """Megatron-Bridge's performance family (``-m``) of recipe ``name``: its model family's ``perf_family``."""
    return get_family(resolved_family(get_recipe(name).fn().model)).perf_family


def perf_config(args: argparse.Namespace) -> PerfConfig | None:
    """The flat perf recipe ``-mr/-g/-c/-ng`` select as Megatron-Bridge's launcher does
    (:func:`~megatron_bridge.recipes.perf_configs.get_perf_config`: the one of ``-ng`` GPUs, else the default one);
    None without ``-g`` or when Megatron-Bridge has none for the recipe, GPU and dtype."""
    if args.gpu is None:
        return None
    return get_perf_config(recipe_name(args), args.gpu, args.compute_dtype or "bf16", args.num_gpus)


def _set_compute_dtype(cfg: ConfigContainer, dtype: str | None, has_perf_config: bool) -> None:
    if dtype is None or has_perf_config:  # a perf config already set its own precision for the dtype
        return
    # the preset's name where the launcher keeps it unchanged (the YAML then names it), else the changed config
    cfg.mixed_precision = precision_config(dtype) if dtype in PERF_PRESET_CHANGES else COMPUTE_DTYPE_PRESETS[dtype]


def _set_recompute(cfg: ConfigContainer, args: argparse.Namespace) -> None:
    if args.recompute_num_layers is not None:
        m = cfg.model
        m.recompute_granularity, m.recompute_method, m.recompute_num_layers = "full", "block", args.recompute_num_layers
    if args.recompute_modules is not None:
        unknown = [m for m in args.recompute_modules if m not in RECOMPUTE_MODULES]
        if unknown or not args.recompute_modules:
            raise ConfigValidationError(f"--recompute_modules {','.join(args.recompute_modules)}: this version "
                                        f"recomputes only {sorted(RECOMPUTE_MODULES)} (selective recompute)")
        cfg.model.recompute_granularity, cfg.model.recompute_method = "selective", None
    if args.activation_offload_layers is not None:
        cfg.model.cpu_offloading, cfg.model.cpu_offloading_weights = True, False
        cfg.model.cpu_offloading_num_layers = args.activation_offload_layers


def apply_flags(cfg: ConfigContainer, args: argparse.Namespace, has_perf_config: bool) -> ConfigContainer:
    """The user's flags, as Megatron-Bridge's ``set_user_overrides`` applies them (in place)."""
    m, t = cfg.model, cfg.train
    _set_compute_dtype(cfg, args.compute_dtype, has_perf_config)
    if args.use_megatron_fsdp:
        megatron_fsdp_overrides(cfg)
    if args.use_torch_fsdp2 is not None:
        cfg.dist.use_torch_fsdp2 = args.use_torch_fsdp2
    _set_recompute(cfg, args)
    if args.max_steps is not None:
        t.train_iters, t.train_samples = args.max_steps, None
        cfg.scheduler.lr_decay_iters = args.max_steps
    if args.tensor_model_parallel_size is not None:
        m.tensor_model_parallel_size = args.tensor_model_parallel_size
        m.sequence_parallel = args.tensor_model_parallel_size > 1  # as Megatron-Bridge
        if args.use_torch_fsdp2 is None and not cfg.dist.use_megatron_fsdp:
            cfg.dist.use_torch_fsdp2 = args.tensor_model_parallel_size > 1  # TP: FSDP2 (recipes/base.py)
    for flag, path in (("pipeline_model_parallel_size", "pipeline_model_parallel_size"),
                       ("context_parallel_size", "context_parallel_size"),
                       ("expert_model_parallel_size", "expert_model_parallel_size")):
        if getattr(args, flag) is not None:
            setattr(m, path, getattr(args, flag))
    if args.virtual_pipeline_model_parallel_size != VP_UNSET:
        m.virtual_pipeline_model_parallel_size = args.virtual_pipeline_model_parallel_size
    if args.expert_tensor_parallel_size != VP_UNSET:  # "-et" alone or "-et None": Megatron's default (None)
        m.expert_tensor_parallel_size = args.expert_tensor_parallel_size
    if args.global_batch_size is not None:
        t.global_batch_size = args.global_batch_size
    if args.micro_batch_size is not None:
        t.micro_batch_size = args.micro_batch_size
    if args.seq_length is not None:
        m.seq_length = cfg.dataset.seq_length = args.seq_length
    if args.lr is not None:
        cfg.optimizer.lr = args.lr
    if args.min_lr is not None:
        cfg.optimizer.min_lr = args.min_lr
    return cfg


def _model_parallel(cfg: ConfigContainer) -> int:
    m = cfg.model
    return m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size


def weak_scale_global_batch(cfg: ConfigContainer, base_gbs: int, base_dp: int, num_gpus: int) -> None:
    """Megatron-Bridge's weak scaling: when the recipe's global batch is unchanged and the data-parallel size
    differs from the one it was laid out for, scale the global batch by dp / base_dp (at least one sample per
    data-parallel rank and micro-batch)."""
    dp = max(1, num_gpus // _model_parallel(cfg))
    if cfg.train.global_batch_size != base_gbs or dp == base_dp:
        return
    cfg.train.global_batch_size = max(base_gbs * dp // base_dp, dp * cfg.train.micro_batch_size)


def build_config(args: argparse.Namespace) -> ConfigContainer:
    """Recipe → perf config (``-g``) → benchmark defaults → key=value overrides → flags → weak-scaled batch."""
    name = recipe_name(args)
    cfg = get_recipe(name).fn()
    perf = perf_config(args)
    base_gpus = get_recipe(name).world_size
    if perf is not None:
        perf.apply(cfg, args.compute_dtype or "bf16")
        base_gpus = perf.num_gpus
    base_gbs, base_dp = cfg.train.global_batch_size, max(1, base_gpus // _model_parallel(cfg))
    common_perf_overrides(cfg, train_iters=args.max_steps or DEFAULT_STEPS, warmup_iters=args.warmup_iters)
    cfg = cfg.apply_overrides(overrides=args.overrides)
    apply_flags(cfg, args, perf is not None)
    if args.global_batch_size is None and args.num_gpus is not None:
        weak_scale_global_batch(cfg, base_gbs, base_dp, args.num_gpus)
    return cfg


def environment(args: argparse.Namespace, cfg: ConfigContainer) -> dict[str, str]:
    """Environment variables of the run: the perf config's (Megatron-Bridge's ``env_vars``). With Megatron FSDP,
    CUDA_DEVICE_MAX_CONNECTIONS is 32 (megatron-fsdp needs more than 1, as Megatron-Bridge's FSDP perf recipes set)."""
    perf = perf_config(args)
    env: dict[str, Any] = dict(perf.env_vars) if perf is not None else {}
    if cfg.dist.use_megatron_fsdp and str(env.get("CUDA_DEVICE_MAX_CONNECTIONS")) == "1":
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"
    return {k: str(v) for k, v in env.items()}
