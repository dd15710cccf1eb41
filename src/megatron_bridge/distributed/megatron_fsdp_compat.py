"""What the installed megatron-fsdp accepts, and the config → ``fully_shard_model`` argument mapping.

megatron-fsdp is imported lazily (never at import time of the config or recipe layers). This module, without
touching CUDA:

* reads which keyword arguments ``fully_shard_model`` takes (``inspect.signature``); the backend needs the
  megatron-fsdp >= 0.4 API (``mixed_precision_policy``, ``report_nan_in_param_grad``) and is tested with 0.6.1;
* builds the arguments from ``cfg.ddp`` with the pure function :func:`megatron_fsdp_kwargs` (the option table is in
  docs/training/megatron-fsdp.md); an option the installed version does not take raises a MegatronBridgeError
  naming the option, the version and the fix;
* checks that the ``DistributedDataParallelConfig`` megatron-fsdp will build has every field it passes. When
  megatron-core is importable megatron-fsdp builds megatron-core's class instead of its own, and megatron-fsdp
  >= 0.4 with megatron-core <= 0.16.1 fails inside ``fully_shard_model``
  (``fsdp_db_use_persist_buf_on_alloc_fail``): :func:`check_ddp_config_compatible` names the fix first
  (docs/installation.md).
"""

import ast
import dataclasses
import importlib
import inspect
import sys
import textwrap
from collections.abc import Callable, Iterable
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from megatron_bridge.config.adjustments import apply_adjustment
from megatron_bridge.config.rule_set import enforce
from megatron_bridge.distributed.common import no_split_module_names
from megatron_bridge.errors import MegatronBridgeError, MissingDependencyError
from megatron_bridge.utils.logging import get_logger, log_rank_0


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

logger = get_logger(__name__)


TESTED_VERSION = "0.6.1"
"""The megatron-fsdp version this backend is built and tested against (requirements/cpu.txt)."""

NO_CUDA_MESSAGE = (
    "Megatron FSDP needs CUDA; megatron-fsdp has no CPU code path; use dist.use_torch_fsdp2 on CPU (or DDP), or run "
    "on a CUDA GPU (megatron-fsdp creates CUDA streams and moves its buffers to cuda:<rank> unconditionally)"
)

PAIRING_FIX = (
    "Fix: remove megatron-core from this environment (megatron-fsdp then uses its own config class), or pair the "
    "versions: on Python 3.11 megatron-core 0.16.1 only works with megatron-fsdp 0.3.1; megatron-fsdp 0.6.1 needs "
    "megatron-core >= 0.19.0 (Python >= 3.12). See docs/installation.md."
)


def import_megatron_fsdp() -> ModuleType:
    """``import megatron_fsdp`` with a named error when it is missing or cannot be imported."""
    try:
        import megatron_fsdp
    except ImportError as exc:
        raise MissingDependencyError(
            f"dist.use_megatron_fsdp=True needs the megatron-fsdp package ({exc}). Fix: pip install "
            f"megatron-fsdp=={TESTED_VERSION} (it is a core dependency of this library), or set "
            "dist.use_megatron_fsdp=False."
        ) from exc
    except RuntimeError as exc:  # transformer-engine installed without CUDA breaks every importer of megatron_fsdp
        raise MissingDependencyError(
            f"importing megatron-fsdp failed: {exc}. If transformer-engine is installed on a machine without CUDA, "
            "uninstall it (pip uninstall transformer-engine); see docs/installation.md."
        ) from exc
    return megatron_fsdp


def installed_version() -> str:
    """The installed megatron-fsdp version string ("unknown" when no distribution metadata is found)."""
    try:
        return version("megatron-fsdp")
    except PackageNotFoundError:
        return "unknown"


def require_cuda(device: torch.device) -> None:
    """Raise the named no-CUDA error unless ``device`` is a CUDA device and CUDA is available."""
    if device.type != "cuda" or not torch.cuda.is_available():
        raise MegatronBridgeError(f"{NO_CUDA_MESSAGE} (device {device}, torch.cuda.is_available()="
                                  f"{torch.cuda.is_available()})")


def accepted_parameters(fn: Callable[..., Any]) -> frozenset[str]:
    """Names of the keyword arguments ``fn`` accepts."""
    return frozenset(inspect.signature(fn).parameters)


@lru_cache(maxsize=1)
def _buffer_init_source(cls: type) -> str:
    try:
        return inspect.getsource(cls._init_fsdp_param_and_grad_buffer)
    except (AttributeError, OSError, TypeError):
        return ""


def average_in_collective_needs_experts(mfsdp: ModuleType) -> bool:
    """True when the installed megatron-fsdp sizes the expert data-parallel group whenever
    ``average_in_collective`` is on (0.6.1 does; without experts that group is None and the wrap crashes)."""
    return "get_dp_group(is_expert_parallel=True).size()" in _buffer_init_source(mfsdp.MegatronFSDP)


def require_policy_api(params: Iterable[str]) -> None:
    """Raise unless ``fully_shard_model`` takes ``mixed_precision_policy`` (megatron-fsdp >= 0.4).

    Raises:
        MegatronBridgeError: an older megatron-fsdp (0.3.x, the one megatron-core 0.16.1 pairs with).
    """
    if "mixed_precision_policy" not in set(params):
        raise MegatronBridgeError(
            f"megatron-fsdp {installed_version()} predates MixedPrecisionPolicy (fully_shard_model has no "
            "mixed_precision_policy argument), so ddp.grad_reduce_in_fp32 and ddp.preserve_fp32_weights cannot be "
            f"passed. Fix: pip install megatron-fsdp=={TESTED_VERSION}; with megatron-core in the same environment "
            "that needs megatron-core >= 0.19.0 (Python >= 3.12), see docs/installation.md."
        )


def check_accepted(kwargs: dict[str, Any], params: Iterable[str], sources: dict[str, str],
                   droppable: frozenset[str]) -> dict[str, Any]:
    """Return ``kwargs`` restricted to what the installed ``fully_shard_model`` accepts.

    A keyword it lacks is dropped when it is in ``droppable`` and off (False/None: the feature is not asked for);
    otherwise it raises.

    Raises:
        MegatronBridgeError: naming the config option behind the keyword, the installed version and the fix.
    """
    names = set(params)
    kept: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in names:
            kept[key] = value
        elif key in droppable and (value is False or value is None):
            continue
        else:
            option = sources.get(key, key)
            alternative = f", or leave {option} at its default" if key in droppable else ""
            raise MegatronBridgeError(
                f"{option}={value!r} needs the fully_shard_model argument {key!r}, which the installed megatron-fsdp "
                f"{installed_version()} does not accept. Fix: pip install megatron-fsdp=={TESTED_VERSION}"
                f"{alternative}."
            )
    return kept


@lru_cache(maxsize=8)
def _ddp_config_kwargs_passed(fn: Callable[..., Any]) -> frozenset[str] | None:
    """Keywords ``fn``'s source passes to ``DistributedDataParallelConfig(...)`` (None when it cannot be read)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "DistributedDataParallelConfig":
            found.update(k.arg for k in node.keywords if k.arg)
    return frozenset(found) if found else None


def check_ddp_config_compatible(fully_shard_model: Callable[..., Any]) -> None:
    """Fail early, with the version fix, when megatron-fsdp would build a DDP config lacking fields it passes.

    Raises:
        MegatronBridgeError: megatron-core's DistributedDataParallelConfig (used because megatron-core is
            importable) lacks fields that this megatron-fsdp passes to it.
    """
    module = sys.modules.get(getattr(fully_shard_model, "__module__", ""), None)
    config_cls = getattr(module, "DistributedDataParallelConfig", None)
    passed = _ddp_config_kwargs_passed(fully_shard_model)
    if config_cls is None or passed is None or not dataclasses.is_dataclass(config_cls):
        return
    fields = {f.name for f in dataclasses.fields(config_cls)}
    missing = sorted(passed - fields)
    if not missing:
        return
    core = _package_version("megatron-core")
    raise MegatronBridgeError(
        f"megatron-fsdp {installed_version()} cannot wrap a model in this environment: megatron-core {core} is "
        f"importable, so megatron-fsdp builds megatron-core's {config_cls.__module__}.DistributedDataParallelConfig, "
        f"which lacks the fields {missing} that megatron-fsdp passes. {PAIRING_FIX}"
    )


def _package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "(no metadata)"


# ------------------------------------------------------------------------------------------ config → kwargs
SHARDING_STRATEGY_IDS: dict[str, int] = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
"""ddp.data_parallel_sharding_strategy → ``zero_dp_strategy`` (megatron_fsdp's ShardingStrategy values)."""

MESH_DIM_NAMES = ("dp_cp", "tp")
"""The 2-D mesh handed to megatron-fsdp: (world / TP, TP) (:func:`.megatron_fsdp_tp.fsdp_mesh_shape`); the sharding
dimension is the flattened data × context-parallel group, named as megatron-core's adapter names it."""

RUNTIME_KWARGS = ("module", "device_mesh", "device")
"""Arguments ``wrap()`` adds to :func:`megatron_fsdp_kwargs`'s at call time (not derived from the config)."""

KWARG_SOURCES: dict[str, str] = {
    "fsdp_unit_modules": "ddp.megatron_fsdp_unit_modules",
    "zero_dp_strategy": "ddp.data_parallel_sharding_strategy",
    "init_model_with_meta_device": "model.init_model_with_meta_device",
    "mixed_precision_policy": "ddp.grad_reduce_in_fp32/ddp.preserve_fp32_weights",
    "sync_model_each_microbatch": "(the backend's gradient-accumulation control)",
    "preproc_state_dict_for_dcp_ckpt": "checkpoint.ckpt_format='fsdp_dtensor'",
    "dp_shard_dim": "(the backend's device mesh)",
    "tp_dim": "(the backend's device mesh)",
    **{k: f"ddp.{k}" for k in ("overlap_grad_reduce", "overlap_param_gather", "report_nan_in_param_grad",
                               "average_in_collective", "disable_bucketing", "calculate_per_token_loss",
                               "keep_fp8_transpose_cache", "nccl_ub", "fsdp_double_buffer")},
}
"""fully_shard_model keyword → the config option it comes from (used in error messages)."""

DROPPABLE = frozenset({
    "init_model_with_meta_device", "report_nan_in_param_grad", "average_in_collective",
    "disable_bucketing", "calculate_per_token_loss", "keep_fp8_transpose_cache", "nccl_ub", "fsdp_double_buffer",
})
"""Feature flags that may be left out when off and the installed version lacks them."""


def resolve_unit_modules(class_paths: list[str] | None, model: nn.Module) -> list[type[nn.Module]]:
    """The FSDP unit classes: imported from ``class_paths``, or (None) the classes of ``model``'s submodules whose
    class name its ``_no_split_modules`` lists.

    Raises:
        MegatronBridgeError: a path does not import, or no submodule matches (an empty list or a path without a
            module is rule megatron_fsdp_unit_modules, which :func:`megatron_fsdp_kwargs` enforces before).
    """
    if class_paths is None:
        names = no_split_module_names(model)
        classes = list(dict.fromkeys(type(m) for m in model.modules() if type(m).__name__ in names))
        if not classes:
            raise MegatronBridgeError(
                f"ddp.megatron_fsdp_unit_modules=None, but {type(model).__name__} has no submodule whose class is "
                f"listed in its _no_split_modules ({sorted(names) or 'none declared'}). Fix: set "
                "ddp.megatron_fsdp_unit_modules to the class paths of its decoder blocks, e.g. "
                "['megatron_bridge.models.llama.LlamaDecoderLayer']."
            )
        return classes
    classes = []  # an empty list or a short path: rule megatron_fsdp_unit_modules (megatron_fsdp_kwargs enforces it)
    for path in class_paths:
        module_path, _, class_name = path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_path), class_name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise MegatronBridgeError(
                f"ddp.megatron_fsdp_unit_modules: cannot import {path!r} ({exc}). Fix: use a full class path, e.g. "
                "'megatron_bridge.models.llama.LlamaDecoderLayer'."
            ) from exc
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise MegatronBridgeError(f"ddp.megatron_fsdp_unit_modules: {path!r} is not a torch.nn.Module class path.")
        if not any(isinstance(m, cls) for m in model.modules()):
            raise MegatronBridgeError(f"ddp.megatron_fsdp_unit_modules: no submodule of {type(model).__name__} is a "
                                      f"{path}. Fix: list the model's block classes, or set None.")
        classes.append(cls)
    return classes


def megatron_fsdp_kwargs(cfg: "ConfigContainer", model: nn.Module,
                         params: Iterable[str] | None = None) -> dict[str, Any]:
    """The keyword arguments of ``megatron_fsdp.fully_shard_model`` for ``cfg`` and ``model`` (without
    :data:`RUNTIME_KWARGS`), checked against ``params`` (default: the installed signature).

    Raises:
        MegatronBridgeError: an invalid value, or an option the installed megatron-fsdp does not accept.
    """
    mfsdp = import_megatron_fsdp()
    names = frozenset(params) if params is not None else accepted_parameters(mfsdp.fully_shard_model)
    d = cfg.ddp
    enforce(cfg, "field_types", "megatron_fsdp_meta_init", "positive_sizes", "megatron_fsdp_unit_modules")
    strategy = d.data_parallel_sharding_strategy
    meta = cfg.model.init_model_with_meta_device
    kwargs: dict[str, Any] = {
        "fsdp_unit_modules": resolve_unit_modules(d.megatron_fsdp_unit_modules, model),
        "dp_shard_dim": MESH_DIM_NAMES[0],
        "tp_dim": MESH_DIM_NAMES[1],
        "zero_dp_strategy": SHARDING_STRATEGY_IDS[strategy],
        "init_model_with_meta_device": meta,
        "overlap_grad_reduce": d.overlap_grad_reduce,
        "overlap_param_gather": d.overlap_param_gather,
        "sync_model_each_microbatch": False,  # the loop syncs on the last micro-batch (grad_sync_context)
        "preproc_state_dict_for_dcp_ckpt": True,  # DTensor state dicts ready for DCP (fsdp_dtensor)
        "average_in_collective": d.average_in_collective,
        "disable_bucketing": d.disable_bucketing,
        "calculate_per_token_loss": d.calculate_per_token_loss,
        "keep_fp8_transpose_cache": d.keep_fp8_transpose_cache,
        "nccl_ub": d.nccl_ub,
        "fsdp_double_buffer": d.fsdp_double_buffer,
    }
    require_policy_api(names)
    if d.average_in_collective and average_in_collective_needs_experts(mfsdp):
        apply_adjustment(cfg, "megatron_fsdp_average_in_collective")  # as validate() does; logged once
        kwargs["average_in_collective"] = d.average_in_collective
    fp32 = torch.float32
    kwargs["mixed_precision_policy"] = mfsdp.MixedPrecisionPolicy(
        main_params_dtype=fp32 if d.preserve_fp32_weights else None,
        main_grads_dtype=fp32 if d.grad_reduce_in_fp32 else None,
        grad_comm_dtype=None,
    )
    kwargs["report_nan_in_param_grad"] = d.report_nan_in_param_grad
    return check_accepted(kwargs, names, KWARG_SOURCES, DROPPABLE)


def apply_communication_unit_size(wrapped: nn.Module, size: int | None) -> None:
    """``ddp.bucket_size`` → megatron-fsdp's suggested communication unit (reduce-scatter queue capacity, half of
    it as all-gather prefetch), which its ``fully_shard_model`` does not take as an argument.

    Raises:
        MegatronBridgeError: the installed megatron-fsdp has no such attributes (``size <= 0`` is rule
            positive_sizes, which :func:`megatron_fsdp_kwargs` enforces before).
    """
    if size is None:
        return
    names = ("suggested_RS_queue_capacity", "suggested_AG_prefetch_size")
    if not all(hasattr(wrapped, n) for n in names):
        raise MegatronBridgeError(f"ddp.bucket_size={size}: megatron-fsdp {installed_version()} has no "
                                  f"{names} to set. Fix: set ddp.bucket_size=None, or pip install "
                                  f"megatron-fsdp=={TESTED_VERSION}.")
    if hasattr(getattr(wrapped, "ddp_config", None), "suggested_communication_unit_size"):
        wrapped.ddp_config.suggested_communication_unit_size = size
    wrapped.suggested_RS_queue_capacity = size
    wrapped.suggested_AG_prefetch_size = size // 2



def log_forced_overlap(cfg: "ConfigContainer") -> None:
    """Log the overlap options megatron-fsdp turns on itself for the sharding strategy."""
    d = cfg.ddp
    strategy = d.data_parallel_sharding_strategy
    forced = []
    if strategy in ("optim_grads", "optim_grads_params") and not d.overlap_grad_reduce:
        forced.append("overlap_grad_reduce")
    if strategy == "optim_grads_params" and not d.overlap_param_gather:
        forced.append("overlap_param_gather")
    if forced:
        log_rank_0(logger, "Megatron FSDP: %s turned on by megatron-fsdp for sharding strategy %r", forced, strategy)


def defer_single_rank_grad_scaling(wrapped: nn.Module) -> list[tuple[list[nn.Parameter], float]]:
    """Work around megatron-fsdp 0.6.1 scaling accumulated gradients again at every micro-batch when a bucket's
    data-parallel group has one rank under sharded gradients (``optim_grads``/``optim_grads_params``): its gradient
    buffer is then not distributed, the reduction runs in place on it, and ``gradient_reduce_preprocessing`` multiplies
    the earlier micro-batches' (already scaled) gradients once more (micro-batch 1 of 2 ends up at 1/4 instead of 1/2
    of its sum at DP 2). That happens to the experts of an expert-data-parallel group of one rank (EP = dp × cp).

    Such buckets get no scaling from megatron-fsdp (a sum over one rank changes nothing); the returned
    ``(distributed parameters, factor)`` pairs are scaled once by the backend after the reduction
    (``MegatronFSDPBackend.finish_grad_sync``). Empty for other strategies and groups.
    """
    if getattr(wrapped, "data_parallel_sharding_strategy", None) not in ("optim_grads", "optim_grads_params"):
        return []
    buffer = wrapped.param_and_grad_buffer
    optimized = dict(buffer.optimizer_named_parameters)  # the parameters megatron-fsdp attaches gradients to
    deferred = []
    for group in buffer.parameter_groups:
        gbuf = group.main_grad_buffer
        if gbuf is None or gbuf.is_data_distributed or gbuf.gradient_scaling_factor is None:
            continue
        params = [optimized[buffer.param_to_name[p]] for p in group.params]
        deferred.append((params, float(gbuf.gradient_scaling_factor)))
        gbuf.gradient_scaling_factor = None
    return deferred
