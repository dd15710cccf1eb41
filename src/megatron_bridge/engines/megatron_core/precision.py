"""Mixed precision on the megatron-core engine, as Megatron-Bridge applies a ``MixedPrecisionConfig``.

Megatron-Bridge's ``MixedPrecisionConfig.setup`` copies every preset field whose name also exists on megatron-core's
``TransformerConfig``, ``OptimizerConfig`` and ``DistributedDataParallelConfig`` into them; its ``get_model`` then
wraps bf16/fp16 models in megatron-core's ``Float16Module``. This module builds the same values from this library's
config (after ``finalize()``, so ``model.params_dtype`` already holds the preset's dtype, see the
``mixed_precision_preset`` adjustment):

=====================================  =================================================================================
megatron-core                          from
=====================================  =================================================================================
TransformerConfig.bf16 / fp16          ``optimizer.bf16`` / ``optimizer.fp16`` (the preset's ``bf16`` / ``fp16``)
params_dtype, pipeline_dtype,          ``model.params_dtype`` (bf16/fp16 with those presets on this engine);
autocast_dtype                         ``model.pipeline_dtype`` when set
fp8, fp8_recipe, fp8_margin,           the preset's fields of the same names
fp8_amax_history_len,
fp8_amax_compute_algo,
first_last_layers_bf16,
num_layers_at_start/end_in_bf16,
fp4, fp4_recipe
fp8_param / fp4_param                  ``fp8_param_gather`` / ``fp4_param_gather`` (Megatron-Bridge keeps them equal)
OptimizerConfig.bf16 / fp16,           ``optimizer.bf16`` / ``fp16`` / ``loss_scale`` / ``initial_loss_scale``,
params_dtype, loss_scale,              ``model.params_dtype``; with bf16/fp16 megatron-core keeps fp32 main parameters
initial_loss_scale                     (``Float16OptimizerWithFloat16Params`` or the distributed optimizer)
OptimizerConfig.fp8_recipe,            the preset's fields
reuse_grad_buf_for_mxfp8_param_ag
DDPConfig.grad_reduce_in_fp32          ``ddp.grad_reduce_in_fp32`` (the preset's value)
DDPConfig.fp8_param_gather,            the preset's fields
fp4_param_gather,
reuse_grad_buf_for_mxfp8_param_ag
=====================================  =================================================================================

Without a preset (``mixed_precision=None``) the FP8/FP4 fields keep megatron-core's defaults (off). fp16 keeps
megatron-core's dynamic loss scaler (in its optimizer); :class:`MegatronCoreLossScaler` lets the training loop scale
the loss by it. docs/training/low-precision.md lists where this differs from the native engine's ``bf16_mixed``.
"""

from typing import TYPE_CHECKING, Any

import torch
from torch import nn


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.config.mixed_precision import MixedPrecisionConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

_SAME_NAME_TRANSFORMER = ("fp8", "fp8_recipe", "fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo",
                          "first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16", "fp4",
                          "fp4_recipe")
_SAME_NAME_OPTIMIZER = ("fp8_recipe", "reuse_grad_buf_for_mxfp8_param_ag")
_SAME_NAME_DDP = ("fp8_param_gather", "fp4_param_gather", "reuse_grad_buf_for_mxfp8_param_ag")


def _preset(cfg: "ConfigContainer") -> "MixedPrecisionConfig | None":
    from megatron_bridge.config.mixed_precision import MixedPrecisionConfig

    mp = cfg.mixed_precision_config
    return mp if isinstance(mp, MixedPrecisionConfig) else None


def transformer_precision(cfg: "ConfigContainer") -> dict[str, Any]:
    """``TransformerConfig`` keyword arguments for the precision of ``cfg`` (see the module table)."""
    params = DTYPES[cfg.model.params_dtype]
    out: dict[str, Any] = {
        "bf16": cfg.optimizer.bf16,
        "fp16": cfg.optimizer.fp16,
        "params_dtype": params,
        "pipeline_dtype": DTYPES[cfg.model.pipeline_dtype or cfg.model.params_dtype],
        "autocast_dtype": params,
    }
    mp = _preset(cfg)
    if mp is not None:
        out.update({name: getattr(mp, name) for name in _SAME_NAME_TRANSFORMER})
        out["fp8_param"] = mp.fp8_param_gather
        out["fp4_param"] = mp.fp4_param_gather
    return out


def optimizer_precision(cfg: "ConfigContainer") -> dict[str, Any]:
    """``OptimizerConfig`` keyword arguments for the precision of ``cfg``: bf16/fp16 make megatron-core keep fp32
    main parameters (and, with fp16, its loss scaler)."""
    o = cfg.optimizer
    out: dict[str, Any] = {"bf16": o.bf16, "fp16": o.fp16, "params_dtype": DTYPES[cfg.model.params_dtype],
                           "loss_scale": o.loss_scale, "initial_loss_scale": o.initial_loss_scale}
    mp = _preset(cfg)
    if mp is not None:
        out.update({name: getattr(mp, name) for name in _SAME_NAME_OPTIMIZER})
    return out


def ddp_precision(cfg: "ConfigContainer") -> dict[str, Any]:
    """``DistributedDataParallelConfig`` keyword arguments for the precision of ``cfg``."""
    out: dict[str, Any] = {"grad_reduce_in_fp32": cfg.ddp.grad_reduce_in_fp32}
    mp = _preset(cfg)
    if mp is not None:
        out.update({name: getattr(mp, name) for name in _SAME_NAME_DDP})
    return out


def wrap_float16(chunk: nn.Module, config: Any) -> nn.Module:
    """megatron-core's ``Float16Module`` around ``chunk`` when ``config`` computes in bf16/fp16 (as Megatron-Bridge's
    ``get_model`` does): the weights are cast to that dtype, first-stage float inputs too, last-stage outputs (the
    per-token losses) come back in fp32."""
    if not (config.bf16 or config.fp16):
        return chunk
    from megatron.core.transformer.module import Float16Module

    return Float16Module(config, chunk)


def unwrap_float16(module: nn.Module) -> nn.Module:
    """The module inside a ``Float16Module`` (``module`` itself otherwise)."""
    from megatron.core.transformer.module import Float16Module

    return module.module if isinstance(module, Float16Module) else module


class MegatronCoreLossScaler:
    """fp16 loss scaling by megatron-core's own scaler (inside its optimizer), with the two methods the training
    loop calls on ``torch.amp.GradScaler``: megatron-core unscales, checks for inf/NaN and updates the scale in
    ``optimizer.step()``."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the current loss scale."""
        return loss * self.optimizer.get_loss_scale().to(loss.device)

    def get_scale(self) -> float:
        """The current loss scale."""
        return float(self.optimizer.get_loss_scale())
