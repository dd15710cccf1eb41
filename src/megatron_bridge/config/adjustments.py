"""The few values ``finalize()`` adjusts, each one logged once (validation never rewrites silently).

Every adjustment here is listed, with its reason, in docs/training/config-container.md; a test keeps the two in step.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from megatron_bridge.config.mixed_precision import MixedPrecisionConfig, get_mixed_precision_preset
from megatron_bridge.utils.logging import get_logger, warn_once


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

logger = get_logger(__name__)


@dataclass(frozen=True)
class Adjustment:
    """One documented adjustment: its id, what it does, and the function applying it."""

    id: str
    summary: str
    apply: Callable[["ConfigContainer"], None]


ADJUSTMENTS: list[Adjustment] = []
_LOGGED: set[str] = set()


def _adjustment(id: str, summary: str) -> Callable[[Callable[["ConfigContainer"], None]], Callable]:
    def wrap(fn: Callable[["ConfigContainer"], None]) -> Callable[["ConfigContainer"], None]:
        ADJUSTMENTS.append(Adjustment(id, summary, fn))
        return fn

    return wrap


def _set(cfg: "ConfigContainer", path: str, value: object, reason: str, level: int = logging.WARNING) -> None:
    """Set ``cfg.<path>`` to ``value`` and log it (once per process and path/value) if it changes."""
    *parents, leaf = path.split(".")
    obj: object = cfg
    for p in parents:
        obj = getattr(obj, p)
    old = getattr(obj, leaf)
    if old == value:
        return
    setattr(obj, leaf, value)
    key = f"adjust:{path}={value!r}"
    if key not in _LOGGED:
        _LOGGED.add(key)
        logger.log(level, "config: set %s=%r (was %r): %s", path, value, old, reason)


PRESET_FIELDS: tuple[tuple[str, str], ...] = (
    ("model.params_dtype", "params_dtype"),
    ("optimizer.bf16", "bf16"),
    ("optimizer.fp16", "fp16"),
    ("optimizer.loss_scale", "loss_scale"),
    ("optimizer.initial_loss_scale", "initial_loss_scale"),
    ("ddp.grad_reduce_in_fp32", "grad_reduce_in_fp32"),
)
"""Config paths the mixed-precision preset sets, and the MixedPrecisionConfig field each one is copied from."""


def preset_value(cfg: "ConfigContainer", mp: MixedPrecisionConfig, path: str, attr: str) -> object:
    """The value the preset ``mp`` gives ``path``. On the megatron-core engine ``model.params_dtype`` is the preset's
    compute dtype (Megatron-Bridge's meaning: bf16/fp16 model weights, fp32 main weights in megatron-core's optimizer);
    on the native engine its ``params_dtype`` (fp32 weights, bf16/fp16 autocast)."""
    if path == "model.params_dtype" and cfg.model.engine == "megatron_core":
        return mp.compute_dtype
    return getattr(mp, attr)


def preset_conflicts(cfg: "ConfigContainer", paths: set[str]) -> list[str]:
    """Which of ``paths`` (set explicitly, e.g. on the command line) hold a value the ``mixed_precision`` preset
    would replace at ``finalize()``; one description per conflict."""
    if cfg.mixed_precision is None:
        return []
    mp = cfg.mixed_precision
    preset = get_mixed_precision_preset(mp) if isinstance(mp, str) else mp
    name = repr(mp) if isinstance(mp, str) else "(a mapping)"
    out = []
    for path, attr in PRESET_FIELDS:
        if path not in paths:
            continue
        section, leaf = path.split(".")
        value, wanted = getattr(getattr(cfg, section), leaf), preset_value(cfg, preset, path, attr)
        if value != wanted:
            out.append(f"{path}={value!r} would be replaced by mixed_precision={name}, which sets {wanted!r}")
    return out


@_adjustment(
    "mixed_precision_preset",
    "A `mixed_precision` preset name is resolved to a MixedPrecisionConfig and its fields are copied to "
    "model.params_dtype, optimizer.bf16/fp16/loss_scale/initial_loss_scale and ddp.grad_reduce_in_fp32; with "
    "model.engine='megatron_core', model.params_dtype is the preset's compute dtype (Megatron-Bridge's bf16 weights).",
)
def _apply_mixed_precision(cfg: "ConfigContainer") -> None:
    if cfg.mixed_precision is None:
        return
    if isinstance(cfg.mixed_precision, str):
        cfg.mixed_precision = get_mixed_precision_preset(cfg.mixed_precision)
    mp: MixedPrecisionConfig = cfg.mixed_precision
    reason = "copied from the mixed_precision preset"
    for path, attr in PRESET_FIELDS:
        _set(cfg, path, preset_value(cfg, mp, path, attr), reason, level=logging.INFO)


@_adjustment(
    "megatron_fsdp_flags",
    "dist.use_megatron_fsdp and ddp.use_megatron_fsdp are kept equal: setting either one turns both on "
    "(as Megatron-Bridge does).",
)
def _sync_megatron_fsdp(cfg: "ConfigContainer") -> None:
    if cfg.dist.use_megatron_fsdp or cfg.ddp.use_megatron_fsdp:
        reason = "Megatron FSDP was asked for in the other section"
        _set(cfg, "dist.use_megatron_fsdp", True, reason)
        _set(cfg, "ddp.use_megatron_fsdp", True, reason)


@_adjustment(
    "megatron_fsdp_distributed_optimizer",
    "Megatron FSDP shards optimizer state itself: ddp.use_distributed_optimizer and "
    "optimizer.use_distributed_optimizer are set True.",
)
def _megatron_fsdp_dist_opt(cfg: "ConfigContainer") -> None:
    if cfg.dist.use_megatron_fsdp:
        reason = "Megatron FSDP always uses a distributed (sharded) optimizer"
        _set(cfg, "ddp.use_distributed_optimizer", True, reason)
        _set(cfg, "optimizer.use_distributed_optimizer", True, reason)


@_adjustment(
    "distributed_optimizer_flags",
    "ddp.use_distributed_optimizer and optimizer.use_distributed_optimizer are kept equal: either one turns both on.",
)
def _sync_distributed_optimizer(cfg: "ConfigContainer") -> None:
    if cfg.ddp.use_distributed_optimizer or cfg.optimizer.use_distributed_optimizer:
        reason = "the distributed optimizer was asked for in the other section"
        _set(cfg, "ddp.use_distributed_optimizer", True, reason)
        _set(cfg, "optimizer.use_distributed_optimizer", True, reason)


@_adjustment(
    "async_tp_sequence_parallel",
    "fsdp2.enable_async_tensor_parallel requires sequence parallelism: model.sequence_parallel is turned on with a "
    "warning when it is off (as the seed option describes).",
)
def _async_tp_needs_sp(cfg: "ConfigContainer") -> None:
    if cfg.fsdp2.enable_async_tensor_parallel and not cfg.model.sequence_parallel:
        _set(cfg, "model.sequence_parallel", True, "fsdp2.enable_async_tensor_parallel requires sequence parallelism")


@_adjustment(
    "legacy_check_for_nan_in_grad",
    "With Megatron FSDP, ddp.check_for_nan_in_grad=True is a legacy no-op (megatron-fsdp >= 0.5 removed the "
    "buffer-level check): it is kept in the config, ignored, and warned about once per process, pointing to "
    "ddp.report_nan_in_param_grad. Not with model.engine='megatron_core', whose Megatron FSDP adapter still checks "
    "each gradient bucket.",
)
def _legacy_nan_check(cfg: "ConfigContainer") -> None:
    if cfg.dist.use_megatron_fsdp and cfg.ddp.check_for_nan_in_grad and cfg.model.engine != "megatron_core":
        warn_once(
            logger,
            "legacy_check_for_nan_in_grad",
            "ddp.check_for_nan_in_grad=True has no effect with Megatron FSDP (megatron-fsdp>=0.5 removed the "
            "buffer-level gradient NaN check); gradient NaN checking is OFF. Set ddp.report_nan_in_param_grad=True "
            "to enable the per-parameter check (it can reduce throughput).",
        )


@_adjustment(
    "warmup_capped",
    "Warmup as long as the decay or longer (scheduler.lr_warmup_iters >= lr_decay_iters, default train_iters) is "
    "capped to decay - 1 steps, with a warning, as Megatron-Bridge does.",
)
def _cap_warmup(cfg: "ConfigContainer") -> None:
    s = cfg.scheduler
    if s.lr_warmup_fraction is not None or not isinstance(s.lr_warmup_iters, int):
        return
    decay = cfg.lr_decay_iters
    if isinstance(decay, int) and decay > 0 and s.lr_warmup_iters >= decay:
        _set(cfg, "scheduler.lr_warmup_iters", decay - 1,
             f"warmup must be shorter than the {decay} decay steps (scheduler.lr_decay_iters or the run length)")


@_adjustment(
    "megatron_fsdp_average_in_collective",
    "With Megatron FSDP, ddp.average_in_collective=True is set False (logged), as Megatron-Bridge does: the gradients "
    "are the same (divided by the data-parallel size before the sum).",
)
def _mfsdp_average_in_collective(cfg: "ConfigContainer") -> None:
    if cfg.dist.use_megatron_fsdp and cfg.ddp.average_in_collective:
        _set(cfg, "ddp.average_in_collective", False,
             "Megatron FSDP averages by dividing before the reduce-scatter (megatron-fsdp sizes an expert group "
             "for average_in_collective)")


@_adjustment(
    "megatron_core_vpp_p2p",
    "With model.engine='megatron_core' and virtual pipeline stages, model.batch_p2p_comm=True is set False (logged): "
    "megatron-core's interleaved schedule on the batched P2P path gives wrong gradients (NVIDIA/Megatron-LM#750).",
)
def _mcore_vpp_p2p(cfg: "ConfigContainer") -> None:
    m = cfg.model
    if (m.engine == "megatron_core" and m.pipeline_model_parallel_size > 1
            and m.virtual_pipeline_model_parallel_size is not None and m.batch_p2p_comm):
        _set(cfg, "model.batch_p2p_comm", False,
             "megatron-core's interleaved pipeline schedule (virtual stages) is silently wrong with batched P2P "
             "communication (NVIDIA/Megatron-LM#750); it sends and receives one by one instead "
             "(or overlapped with model.overlap_p2p_comm=True)")


@_adjustment(
    "model_family",
    "A config without model.family (written before the field existed) gets the family its shape had then: q/k norm "
    "with experts 'qwen3_moe', q/k norm 'qwen3', else 'llama' (config/families.py, inferred_family).",
)
def _infer_family(cfg: "ConfigContainer") -> None:
    if cfg.model.family is None:
        from megatron_bridge.config.families import inferred_family

        _set(cfg, "model.family", inferred_family(cfg.model), "the config names no model family",
             level=logging.INFO)


def apply_adjustments(cfg: "ConfigContainer") -> None:
    """Apply every adjustment in order."""
    for adjustment in ADJUSTMENTS:
        adjustment.apply(cfg)


def apply_adjustment(cfg: "ConfigContainer", adjustment_id: str) -> None:
    """Apply one adjustment by id (a backend reached without ``validate()`` makes the same adjustment, logged once).

    Raises:
        KeyError: no adjustment has that id (a programming error).
    """
    by_id = {a.id: a for a in ADJUSTMENTS}
    by_id[adjustment_id].apply(cfg)
