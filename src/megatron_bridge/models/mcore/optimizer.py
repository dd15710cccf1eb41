"""megatron-core's optimizer (``get_megatron_optimizer``) from ``cfg.optimizer`` for megatron-core chunks.

It keeps its fp32 main parameters and gradients, clips by the global norm over model-parallel ranks (counting
tensor-parallel duplicates once) and, with ``optimizer.use_distributed_optimizer``, shards its state over the
data-parallel ranks (megatron-core's DistributedOptimizer). The learning rate is set on its ``param_groups`` by this
library's :class:`~megatron_bridge.training.lr_schedule.OptimizerParamScheduler`, as for the native optimizer.
"""

from typing import TYPE_CHECKING, Any

import torch


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def optimizer_config(cfg: "ConfigContainer") -> Any:
    """megatron-core's ``OptimizerConfig`` with the values of ``cfg.optimizer`` (same field names)."""
    from megatron.core.optimizer import OptimizerConfig

    o = cfg.optimizer
    return OptimizerConfig(
        optimizer=o.optimizer,
        lr=o.lr,
        min_lr=o.min_lr,
        weight_decay=o.weight_decay,
        adam_beta1=o.adam_beta1,
        adam_beta2=o.adam_beta2,
        adam_eps=o.adam_eps,
        sgd_momentum=o.sgd_momentum,
        clip_grad=o.clip_grad,
        use_distributed_optimizer=o.use_distributed_optimizer,
        overlap_param_gather=cfg.ddp.overlap_param_gather,
        params_dtype=_DTYPES[cfg.model.params_dtype],
        bf16=False,
        fp16=False,
    )


def build_megatron_optimizer(cfg: "ConfigContainer", chunks: list[torch.nn.Module]) -> Any:
    """``get_megatron_optimizer`` over the megatron-core DDP-wrapped ``chunks``."""
    from megatron.core.optimizer import get_megatron_optimizer

    return get_megatron_optimizer(optimizer_config(cfg), chunks)
