"""Helpers shared by the data-parallel backends: decoder-block discovery, dtypes, autocast and the NaN check."""

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from megatron_bridge.errors import TrainingError
from megatron_bridge.utils.logging import get_logger, warn_once


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

logger = get_logger(__name__)

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def to_torch_dtype(value: str | torch.dtype | None) -> torch.dtype | None:
    """``"bfloat16"`` → ``torch.bfloat16`` (torch dtypes and None pass through)."""
    if value is None or isinstance(value, torch.dtype):
        return value
    return DTYPES[value]


# ------------------------------------------------------------------------------------------------ decoder blocks
@dataclass
class BlockRef:
    """A decoder block found in a model: ``parent.<key>`` is ``module`` (possibly a checkpoint wrapper)."""

    parent: nn.Module
    key: str
    module: nn.Module

    def replace(self, new: nn.Module) -> None:
        """Put ``new`` where the block was (works for ModuleList/ModuleDict entries and attributes)."""
        setattr(self.parent, self.key, new)
        self.module = new


def unwrap_checkpoint(module: nn.Module) -> nn.Module:
    """The module inside (possibly nested) activation-checkpoint wrappers."""
    while hasattr(module, "_checkpoint_wrapped_module"):
        module = module._checkpoint_wrapped_module
    return module


def no_split_module_names(model: nn.Module) -> set[str]:
    """Class names every ``_no_split_modules`` declaration in ``model`` lists (the decoder blocks)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return names


def find_decoder_blocks(model: nn.Module) -> list[BlockRef]:
    """The decoder blocks of ``model`` in forward order: entries of ModuleLists/ModuleDicts whose class name is in
    the model's ``_no_split_modules`` (AutoModel's rule). A model declaring none: every ModuleList entry."""
    names = no_split_module_names(model)
    if not names:
        warn_once(logger, f"no_split_modules:{type(model).__name__}",
                  "%s declares no _no_split_modules: every ModuleList entry is treated as a decoder block",
                  type(model).__name__)
    refs: list[BlockRef] = []
    _collect_blocks(model, names, refs)
    return refs


def _collect_blocks(module: nn.Module, names: set[str], out: list[BlockRef]) -> None:
    container = isinstance(module, (nn.ModuleList, nn.ModuleDict))
    for key, child in module.named_children():
        if container and (not names or type(unwrap_checkpoint(child)).__name__ in names):
            out.append(BlockRef(module, key, child))
        else:
            _collect_blocks(child, names, out)


def has_trainable_params(module: nn.Module) -> bool:
    """True when any parameter of ``module`` requires grad."""
    return any(p.requires_grad for p in module.parameters())


def has_meta_params(modules: list[nn.Module]) -> bool:
    """True when any parameter or buffer of ``modules`` is on the meta device."""
    return any(t.is_meta for m in modules for t in _tensors(m))


def _tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    yield from module.parameters()
    yield from module.buffers()


# ------------------------------------------------------------------------------------------ autocast and NaN
def resolve_autocast_dtype(
    path: str, explicit: str | torch.dtype | None, cfg: "ConfigContainer", *, use_preset: bool
) -> torch.dtype | None:
    """The autocast dtype of a backend: ``explicit`` (the backend's ``autocast_dtype``), else — with
    ``use_preset`` — bfloat16/float16 when ``optimizer.bf16``/``optimizer.fp16`` is set, else None.

    Raises:
        ConfigValidationError: ``explicit`` is float32 (rule ``autocast_dtype``).
    """
    from megatron_bridge.config.rule_set import enforce

    enforce(cfg, "autocast_dtype")
    dtype = to_torch_dtype(explicit)
    if dtype is None and use_preset:
        if cfg.optimizer.bf16:
            dtype = torch.bfloat16
        elif cfg.optimizer.fp16:
            dtype = torch.float16
    return dtype


def autocast_context(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager:
    """``torch.autocast`` on the device's type with ``dtype``; a null context when ``dtype`` is None."""
    if dtype is None:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def check_grad_norm_finite(norm: torch.Tensor, cfg: "ConfigContainer") -> None:
    """With ``ddp.check_for_nan_in_grad``, raise TrainingError when the global gradient norm is NaN or Inf."""
    if cfg.ddp.check_for_nan_in_grad and not bool(torch.isfinite(norm)):
        raise TrainingError(
            f"The global gradient norm is {float(norm)} (ddp.check_for_nan_in_grad=True): training stopped. Lower "
            "optimizer.lr, enable gradient clipping (optimizer.clip_grad) or a mixed-precision preset with fp32 "
            "gradient reduction, or set ddp.check_for_nan_in_grad=False to skip the check."
        )
