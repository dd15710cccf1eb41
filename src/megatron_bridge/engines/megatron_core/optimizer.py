"""megatron-core's optimizer (``get_megatron_optimizer``) from ``cfg.optimizer`` for megatron-core chunks.

It keeps fp32 main parameters and gradients (with bf16/fp16 model weights: ``Float16OptimizerWithFloat16Params``,
or the distributed optimizer's fp32 shards; :mod:`.precision`), clips by the global norm over model-parallel ranks
(counting tensor-parallel duplicates once) and, with ``optimizer.use_distributed_optimizer``, shards its state over the
data-parallel ranks (megatron-core's DistributedOptimizer). The learning rate is set on its ``param_groups`` by this
library's :class:`~megatron_bridge.training.lr_schedule.OptimizerParamScheduler`, as for the native optimizer.
"""

from typing import TYPE_CHECKING, Any

import torch


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer


def optimizer_config(cfg: "ConfigContainer") -> Any:
    """megatron-core's ``OptimizerConfig`` with the values of ``cfg.optimizer`` (same field names)."""
    from megatron.core.optimizer import OptimizerConfig

    from megatron_bridge.engines.megatron_core.precision import optimizer_precision

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
        **optimizer_precision(cfg),
    )


def build_megatron_optimizer(cfg: "ConfigContainer", chunks: list[torch.nn.Module]) -> Any:
    """``get_megatron_optimizer`` over the megatron-core DDP-wrapped ``chunks``."""
    from megatron.core.optimizer import get_megatron_optimizer

    return get_megatron_optimizer(optimizer_config(cfg), chunks)
