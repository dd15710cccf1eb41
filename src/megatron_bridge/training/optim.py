"""The optimizer: AdamW or SGD from torch, with no weight decay on norms and biases."""

import torch
from torch import nn

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)


def param_groups(chunks: list[nn.Module], weight_decay: float) -> list[dict]:
    """Two groups: matrices decay; 1-D parameters (norm weights, biases) do not."""
    decay, no_decay = [], []
    seen: set[int] = set()
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            (no_decay if param.ndim < 2 or name.endswith(".bias") else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay, "decays": True}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0, "decays": False})
    return groups


def _kernel_kwargs(cfg: ConfigContainer, device: torch.device) -> dict[str, bool]:
    impl = cfg.optimizer.implementation
    if impl == "auto":
        impl = "fused" if device.type == "cuda" else "foreach"
    if impl == "fused":
        return {"fused": True}
    return {"foreach": impl == "foreach"}


def build_optimizer(cfg: ConfigContainer, chunks: list[nn.Module], device: torch.device) -> torch.optim.Optimizer:
    """AdamW (``optimizer.optimizer="adam"``) or SGD over the (wrapped) chunks' parameters."""
    o = cfg.optimizer
    groups = param_groups(chunks, o.weight_decay)
    kernel = _kernel_kwargs(cfg, device)
    if o.optimizer == "adam":
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(
            groups, lr=o.lr, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_eps, weight_decay=o.weight_decay, **kernel
        )
    else:
        optimizer = torch.optim.SGD(groups, lr=o.lr, momentum=o.sgd_momentum, weight_decay=o.weight_decay, **kernel)
    n_params = sum(p.numel() for g in groups for p in g["params"])
    logger.debug("optimizer %s over %d parameters (%s)", type(optimizer).__name__, n_params, kernel)
    return optimizer
