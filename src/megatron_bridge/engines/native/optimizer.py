"""The native engine's optimizer: AdamW or SGD from torch, with no weight decay on norms and biases."""

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)


def param_groups(chunks: list[nn.Module], weight_decay: float) -> list[dict]:
    """Two groups: matrices decay; 1-D parameters (norm weights, biases) do not. When sharded (DTensor) and plain
    parameters are mixed (expert-parallel experts next to FSDP2 shards), each kind gets its own groups: torch's
    foreach/fused kernels cannot mix them in one call."""
    decay, no_decay, plain_decay, plain_no_decay = [], [], [], []
    seen: set[int] = set()
    params = [(n, p) for chunk in chunks for n, p in chunk.named_parameters()]
    mixed = len({isinstance(p, DTensor) for _, p in params}) > 1
    for name, param in params:
        if not param.requires_grad or id(param) in seen:
            continue
        seen.add(id(param))
        decays = not (param.ndim < 2 or name.endswith(".bias"))
        if mixed and not isinstance(param, DTensor):
            (plain_decay if decays else plain_no_decay).append(param)
        else:
            (decay if decays else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay, "decays": True}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0, "decays": False})
    if plain_decay:
        groups.append({"params": plain_decay, "weight_decay": weight_decay, "decays": True})
    if plain_no_decay:
        groups.append({"params": plain_no_decay, "weight_decay": 0.0, "decays": False})
    return groups


def _kernel_kwargs(cfg: ConfigContainer, device: torch.device) -> dict[str, bool]:
    impl = cfg.optimizer.implementation
    if impl == "auto":
        impl = "fused" if device.type == "cuda" else "foreach"
    if impl == "fused":
        return {"fused": True}
    return {"foreach": impl == "foreach"}


def build_optimizer(cfg: ConfigContainer, chunks: list[nn.Module], device: torch.device) -> torch.optim.Optimizer:
    """AdamW (``optimizer.optimizer="adam"``) or SGD over the (wrapped) chunks' parameters (the megatron-core
    engine's optimizer is :mod:`megatron_bridge.engines.megatron_core.optimizer`)."""
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
