"""Validation rules of the data-parallel backends (DDP, FSDP2, Megatron FSDP) and the checkpoint formats."""

import os
from typing import TYPE_CHECKING

from megatron_bridge.config.rules import fail, rule


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

AC_SCOPES = ("all", "language", "vision", "audio", "multimodal")


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
             "when checkpoint.save or checkpoint.load is set", "dist.use_megatron_fsdp", "checkpoint.ckpt_format")


@rule("megatron_fsdp_rank_mapping", ("dist.use_megatron_fsdp", "dist.use_tp_pp_dp_mapping"),
      "Megatron FSDP does not support dist.use_tp_pp_dp_mapping.")
def _mfsdp_mapping(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.dist.use_megatron_fsdp and cfg.dist.use_tp_pp_dp_mapping:
        fail("dist.use_tp_pp_dp_mapping=True is not supported with Megatron FSDP: set it to False",
             "dist.use_tp_pp_dp_mapping", "dist.use_megatron_fsdp")


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


@rule("fsdp2_pipeline", ("dist.use_torch_fsdp2", "model.pipeline_model_parallel_size"),
      "FSDP2 is not supported with pipeline parallelism (PP > 1).")
def _fsdp2_pp(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.dist.use_torch_fsdp2 and cfg.model.pipeline_model_parallel_size > 1:
        fail("dist.use_torch_fsdp2=True does not support model.pipeline_model_parallel_size > 1 (got "
             f"{cfg.model.pipeline_model_parallel_size})", "dist.use_torch_fsdp2",
             "model.pipeline_model_parallel_size")


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
