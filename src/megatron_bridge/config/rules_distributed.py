"""Validation rules of the data-parallel backends (DDP, FSDP2, Megatron FSDP) and the checkpoint formats."""

import os
from typing import TYPE_CHECKING

from megatron_bridge.config.rule_registry import fail, positive, rule
from megatron_bridge.config.rules_moe import expert_tensor_parallel_size


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

AC_SCOPES = ("all", "language", "vision", "audio", "multimodal")
TP_STYLES = ("colwise", "rowwise", "sequence_parallel", "replicate")
"""Styles of a custom ``fsdp2.tp_plan`` entry."""


@rule("fsdp_backends_exclusive", ("dist.use_megatron_fsdp", "dist.use_torch_fsdp2"),
      "dist.use_megatron_fsdp and dist.use_torch_fsdp2 are mutually exclusive.")
def _fsdp_exclusive(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.dist.use_megatron_fsdp and cfg.dist.use_torch_fsdp2:
        fail("dist.use_megatron_fsdp and dist.use_torch_fsdp2 are mutually exclusive: set one of them to False",
             "dist.use_megatron_fsdp", "dist.use_torch_fsdp2")


@rule("megatron_fsdp_ckpt_format", ("dist.use_megatron_fsdp", "checkpoint.ckpt_format", "checkpoint.save",
                                    "checkpoint.load"),
      "Megatron FSDP with checkpoint.save or checkpoint.load requires checkpoint.ckpt_format='fsdp_dtensor'.")
def _mfsdp_format(cfg: "ConfigContainer", world_size: int) -> None:
    c = cfg.checkpoint
    if cfg.dist.use_megatron_fsdp and (c.save or c.load) and c.ckpt_format != "fsdp_dtensor":
        fail(f"dist.use_megatron_fsdp=True requires checkpoint.ckpt_format='fsdp_dtensor' (got {c.ckpt_format!r}) "
             "when checkpoint.save or checkpoint.load is set (megatron-core's distributed optimizer has no other "
             "sharding type under Megatron FSDP; Megatron-Bridge refuses the same: 'Megatron-FSDP requires the "
             "fsdp_dtensor checkpointing format!'): set checkpoint.ckpt_format='fsdp_dtensor'",
             "dist.use_megatron_fsdp", "checkpoint.ckpt_format")


@rule("megatron_fsdp_device_connections", ("dist.use_megatron_fsdp",),
      "Megatron FSDP needs CUDA_DEVICE_MAX_CONNECTIONS unset or > 1.")
def _mfsdp_connections(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.dist.use_megatron_fsdp and os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
        fail("dist.use_megatron_fsdp=True needs the environment variable CUDA_DEVICE_MAX_CONNECTIONS unset or > 1 "
             "(got '1'): "
             "unset it (it overlaps communication on separate CUDA streams)", "dist.use_megatron_fsdp")


@rule("fsdp_dtensor_needs_fsdp", ("checkpoint.ckpt_format", "dist.use_megatron_fsdp", "dist.use_torch_fsdp2"),
      "checkpoint.ckpt_format='fsdp_dtensor' with save/load needs an FSDP backend (Megatron FSDP or FSDP2).")
def _fsdp_dtensor(cfg: "ConfigContainer", world_size: int) -> None:
    c = cfg.checkpoint
    if c.ckpt_format == "fsdp_dtensor" and (c.save or c.load) and not (
        cfg.dist.use_megatron_fsdp or cfg.dist.use_torch_fsdp2
    ):
        fail("checkpoint.ckpt_format='fsdp_dtensor' stores FSDP DTensor shards and needs dist.use_megatron_fsdp=True "
             "or "
             "dist.use_torch_fsdp2=True; with DDP use checkpoint.ckpt_format='torch_dist'",
             "checkpoint.ckpt_format", "dist.use_megatron_fsdp", "dist.use_torch_fsdp2")


@rule("async_save_format", ("checkpoint.async_save", "checkpoint.ckpt_format", "checkpoint.save"),
      "checkpoint.async_save needs checkpoint.save and ckpt_format 'torch_dist' or 'fsdp_dtensor'.")
def _async_save(cfg: "ConfigContainer", world_size: int) -> None:
    c = cfg.checkpoint
    if not c.async_save:
        return
    if c.ckpt_format not in ("torch_dist", "fsdp_dtensor"):
        fail(f"checkpoint.async_save=True needs checkpoint.ckpt_format 'torch_dist' or 'fsdp_dtensor' (got "
             f"{c.ckpt_format!r})", "checkpoint.async_save", "checkpoint.ckpt_format")
    if not c.save:
        fail("checkpoint.async_save=True needs checkpoint.save (a folder)", "checkpoint.async_save", "checkpoint.save")


@rule("megatron_fsdp_async_save", ("dist.use_megatron_fsdp", "checkpoint.async_save"),
      "Megatron FSDP saves synchronously: checkpoint.async_save must be False.")
def _mfsdp_async(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.dist.use_megatron_fsdp and cfg.checkpoint.async_save:
        fail("checkpoint.async_save=True is not supported with dist.use_megatron_fsdp=True: DCP's async staging copies "
             "the DTensor shards and drops megatron-fsdp's uneven-shard offsets; set checkpoint.async_save=False",
             "checkpoint.async_save", "dist.use_megatron_fsdp")


@rule("checkpoint_options", ("checkpoint.most_recent_k", "checkpoint.ckpt_step", "checkpoint.finetune"),
      "most_recent_k is -1 or >= 1; ckpt_step needs checkpoint.load; finetune needs load or pretrained_checkpoint.")
def _ckpt_options(cfg: "ConfigContainer", world_size: int) -> None:
    c = cfg.checkpoint
    if c.most_recent_k == 0 or c.most_recent_k < -1:
        fail(f"checkpoint.most_recent_k must be -1 (keep all) or >= 1 (got {c.most_recent_k})",
             "checkpoint.most_recent_k")
    if c.ckpt_step is not None and not c.load:
        fail(f"checkpoint.ckpt_step={c.ckpt_step} needs checkpoint.load", "checkpoint.ckpt_step", "checkpoint.load")
    if c.finetune and not (c.load or c.pretrained_checkpoint):
        fail("checkpoint.finetune=True needs checkpoint.load or checkpoint.pretrained_checkpoint",
             "checkpoint.finetune")


@rule("fsdp2_prefetch_depths", ("fsdp2.fsdp2_forward_prefetch_depth", "fsdp2.fsdp2_backward_prefetch_depth"),
      "FSDP2 prefetch depths are >= 0.")
def _prefetch(cfg: "ConfigContainer", world_size: int) -> None:
    for path in ("fsdp2.fsdp2_forward_prefetch_depth", "fsdp2.fsdp2_backward_prefetch_depth"):
        value = getattr(cfg.fsdp2, path.split(".")[1])
        if value < 0:
            fail(f"{path} must be >= 0 (got {value})", path)


@rule("async_tp_needs_compile", ("fsdp2.enable_async_tensor_parallel", "fsdp2.enable_compile",
                                 "model.tensor_model_parallel_size"),
      "fsdp2.enable_async_tensor_parallel needs TP > 1 and fsdp2.enable_compile (inductor does the overlap).")
def _async_tp(cfg: "ConfigContainer", world_size: int) -> None:
    f = cfg.fsdp2
    if f.enable_async_tensor_parallel and (cfg.model.tensor_model_parallel_size <= 1 or not f.enable_compile):
        fail("fsdp2.enable_async_tensor_parallel=True needs model.tensor_model_parallel_size > 1 and "
             f"fsdp2.enable_compile=True (got TP={cfg.model.tensor_model_parallel_size}, "
             f"enable_compile={f.enable_compile})", "fsdp2.enable_async_tensor_parallel")


@rule("activation_checkpointing_scope", ("ddp.activation_checkpointing_scope", "fsdp2.activation_checkpointing_scope"),
      "Activation-checkpointing scopes are among all/language/vision/audio/multimodal, and 'all' stands alone.")
def _ac_scope(cfg: "ConfigContainer", world_size: int) -> None:
    for path, scope in (("ddp.activation_checkpointing_scope", cfg.ddp.activation_checkpointing_scope),
                        ("fsdp2.activation_checkpointing_scope", cfg.fsdp2.activation_checkpointing_scope)):
        bad = [s for s in scope if s not in AC_SCOPES]
        if bad:
            fail(f"{path} has unknown scopes {bad}; use some of {list(AC_SCOPES)}", path)
        if "all" in scope and len(scope) > 1:
            fail(f"{path}={scope}: 'all' cannot be combined with other scopes", path)
        if not scope:
            fail(f"{path} is empty; use ['all']", path)


@rule("activation_checkpointing_single_knob", ("model.recompute_granularity", "ddp.activation_checkpointing",
                                               "fsdp2.activation_checkpointing"),
      "Activation checkpointing is asked for in one place: model.recompute_granularity or the backend's option.")
def _ac_single(cfg: "ConfigContainer", world_size: int) -> None:
    backend_path = "fsdp2.activation_checkpointing" if cfg.dist.use_torch_fsdp2 else "ddp.activation_checkpointing"
    backend_value = cfg.fsdp2.activation_checkpointing if cfg.dist.use_torch_fsdp2 else cfg.ddp.activation_checkpointing
    granularity = cfg.model.recompute_granularity
    if granularity is not None and backend_value not in (False, None):
        fail(f"model.recompute_granularity={granularity!r} and {backend_path}={backend_value!r} both ask for "
             "activation checkpointing: keep one of them", "model.recompute_granularity", backend_path)


# ------------------------------------------------------------------------------------ tensor parallelism
@rule("megatron_fsdp_expert_tensor_parallel", ("model.expert_tensor_parallel_size", "dist.use_megatron_fsdp",
                                                "model.tensor_model_parallel_size"),
      "With Megatron FSDP on the native engine the routed experts of an MoE model are not split over TP: expert "
      "tensor parallelism (model.expert_tensor_parallel_size, None meaning TP) is 1.")
def _mfsdp_etp(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if not cfg.dist.use_megatron_fsdp or m.engine == "megatron_core" or m.num_moe_experts is None:
        return
    etp = expert_tensor_parallel_size(cfg)
    if etp > 1:
        fail(f"model.expert_tensor_parallel_size={m.expert_tensor_parallel_size} (ETP {etp}) is not supported with "
             "dist.use_megatron_fsdp=True: set model.expert_tensor_parallel_size=1 (experts whole, EP folded over "
             "the TP ranks), or use dist.use_torch_fsdp2=True", "model.expert_tensor_parallel_size",
             "dist.use_megatron_fsdp")


@rule("tensor_parallel_divisible", ("model.ffn_hidden_size", "model.seq_length", "model.tensor_model_parallel_size"),
      "With TP > 1, model.ffn_hidden_size (and model.seq_length with sequence parallelism) is divisible by TP.")
def _tp_divisible(cfg: "ConfigContainer", world_size: int) -> None:
    m, tp = cfg.model, cfg.model.tensor_model_parallel_size
    if tp <= 1:
        return
    checks = [("model.ffn_hidden_size", m.ffn_hidden_size)]
    if m.sequence_parallel:
        checks.append(("model.seq_length", m.seq_length))
    for path, value in checks:
        if value % tp:
            fail(f"{path}={value} must be divisible by model.tensor_model_parallel_size={tp} (tensor parallelism "
                 "shards it evenly): change one of them", path, "model.tensor_model_parallel_size")


def tp_plan_problems(plan: dict[str, str], *, sequence_parallel: bool) -> list[str]:
    """What is wrong with the entries of a custom ``fsdp2.tp_plan`` (empty when nothing is)."""
    problems = []
    for pattern, style in plan.items():
        if style not in TP_STYLES:
            problems.append(f"fsdp2.tp_plan[{pattern!r}]={style!r}: unknown style; use one of {', '.join(TP_STYLES)}")
        elif style == "sequence_parallel" and not sequence_parallel:
            problems.append(f"fsdp2.tp_plan[{pattern!r}]={style!r}: needs model.sequence_parallel=True (the residual "
                            "stream is sharded over the sequence only then); set it, or use 'replicate' for this "
                            "module")
    return problems


@rule("tp_plan_styles", ("fsdp2.tp_plan",),
      "Entries of fsdp2.tp_plan are colwise/rowwise/sequence_parallel/replicate; sequence_parallel needs "
      "model.sequence_parallel.")
def _tp_plan(cfg: "ConfigContainer", world_size: int) -> None:
    plan = cfg.fsdp2.tp_plan
    if isinstance(plan, dict):
        problems = tp_plan_problems(plan, sequence_parallel=cfg.model.sequence_parallel)
        if problems:
            fail("; ".join(problems), "fsdp2.tp_plan")


@rule("tp_plan_matches_model", ("fsdp2.tp_plan", "model.tensor_model_parallel_size"),
      "A custom fsdp2.tp_plan (native engine, TP > 1, PP = 1) matches modules of the model and shards each attention "
      "whole (query/key/value projections colwise, output projection rowwise).")
def _tp_plan_model(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if not (isinstance(cfg.fsdp2.tp_plan, dict) and cfg.dist.use_torch_fsdp2 and m.tensor_model_parallel_size > 1
            and m.pipeline_model_parallel_size == 1 and m.engine == "native"):
        return
    if tp_plan_problems(cfg.fsdp2.tp_plan, sequence_parallel=m.sequence_parallel):
        return  # rule tp_plan_styles names those
    if not positive(m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.vocab_size):
        return  # positive_sizes names them (the check lists the model's modules)
    from megatron_bridge.config.tp_plan import check_custom_plan
    from megatron_bridge.errors import ConfigValidationError

    try:
        check_custom_plan(m, cfg.fsdp2.tp_plan)
    except ConfigValidationError as exc:
        fail(str(exc).rstrip("."), *exc.paths)


@rule("autocast_dtype", ("ddp.autocast_dtype", "fsdp2.autocast_dtype"),
      "Autocast dtypes are 'bfloat16' or 'float16' (None disables autocast); 'float32' is not an autocast dtype.")
def _autocast(cfg: "ConfigContainer", world_size: int) -> None:
    for path, value in (("ddp.autocast_dtype", cfg.ddp.autocast_dtype),
                        ("fsdp2.autocast_dtype", cfg.fsdp2.autocast_dtype)):
        if value == "float32":
            fail(f"{path}='float32' is not an autocast dtype: use 'bfloat16' or 'float16', or None to disable "
                 "autocast", path)


@rule("megatron_fsdp_meta_init", ("model.init_model_with_meta_device", "ddp.data_parallel_sharding_strategy"),
      "Megatron FSDP initializes meta-device models only when it shards parameters (strategy other than no_shard).")
def _mfsdp_meta(cfg: "ConfigContainer", world_size: int) -> None:
    if (cfg.dist.use_megatron_fsdp and cfg.model.init_model_with_meta_device
            and cfg.ddp.data_parallel_sharding_strategy == "no_shard"):
        fail("model.init_model_with_meta_device=True with ddp.data_parallel_sharding_strategy='no_shard': "
             "megatron-fsdp initializes meta models only when it shards parameters. Fix: use a sharding strategy "
             "(e.g. 'optim_grads_params') or set model.init_model_with_meta_device=False",
             "model.init_model_with_meta_device", "ddp.data_parallel_sharding_strategy")


@rule("megatron_fsdp_unit_modules", ("ddp.megatron_fsdp_unit_modules",),
      "With Megatron FSDP, ddp.megatron_fsdp_unit_modules is None (the model's own units) or a non-empty list of full "
      "class paths (package.module.Class).")
def _mfsdp_units(cfg: "ConfigContainer", world_size: int) -> None:
    units = cfg.ddp.megatron_fsdp_unit_modules
    if units is None or not (cfg.dist.use_megatron_fsdp or cfg.ddp.use_megatron_fsdp):
        return
    if not units:
        fail("ddp.megatron_fsdp_unit_modules=[] names no FSDP unit (megatron-fsdp would divide by zero units). Fix: "
             "set None (the model's own units: the native decoder's _no_split_modules, megatron-core's "
             "TransformerLayer) or list block class paths, e.g. ['megatron_bridge.models.llama.LlamaDecoderLayer']",
             "ddp.megatron_fsdp_unit_modules")
    short = [p for p in units if not isinstance(p, str) or not p.rpartition(".")[0]]
    if short:
        fail(f"ddp.megatron_fsdp_unit_modules: {', '.join(map(repr, short))} is not a full class path "
             "(package.module.Class). Fix: e.g. 'megatron_bridge.models.llama.LlamaDecoderLayer', or set None",
             "ddp.megatron_fsdp_unit_modules")
