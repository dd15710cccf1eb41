"""``optimizer.use_distributed_optimizer`` with the DDP backend: ZeRO-1 with torch's ``ZeroRedundancyOptimizer``.

Each data-parallel rank keeps the optimizer state (Adam moments) of about 1/DP of the parameters and updates only
those; the updated parameters are broadcast to the other ranks after each step. Gradients stay replicated (DDP
all-reduces them), so gradient clipping and the loss are unchanged: the run matches the replicated optimizer up to
floating-point summation order.

Checkpoints keep DDP's format (optimizer state keyed by parameter name, replicated): saving gathers the shards
(``consolidate_state_dict`` once per rank), loading gives every rank the full state and keeps its own shard. A
checkpoint saved with or without the distributed optimizer therefore loads into either.
"""

import inspect
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from megatron_bridge.utils.logging import get_logger, log_rank_0


logger = get_logger(__name__)


def shard_optimizer(optimizer: torch.optim.Optimizer) -> ZeroRedundancyOptimizer:
    """A ZeroRedundancyOptimizer of ``optimizer``'s class, groups and hyper-parameters over the default group.

    ``optimizer`` must be fresh (no state yet): its parameter groups and defaults are reused.
    """
    groups = [dict(group) for group in optimizer.param_groups]
    accepted = inspect.signature(type(optimizer).__init__).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted and k != "params"}
    zero = ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), **defaults)
    local = sum(p.numel() for g in zero.optim.param_groups for p in g["params"])
    total = sum(p.numel() for g in groups for p in g["params"])
    log_rank_0(logger, "DDP: distributed optimizer (ZeRO-1, ZeroRedundancyOptimizer): rank 0 holds optimizer state "
               "for %d of %d parameters over %d ranks", local, total, dist.get_world_size())
    return zero


def local_parameter_count(optimizer: ZeroRedundancyOptimizer) -> int:
    """Elements of the parameters whose optimizer state this rank holds."""
    return sum(p.numel() for g in optimizer.optim.param_groups for p in g["params"])


def _plain_copy(zero: ZeroRedundancyOptimizer) -> torch.optim.Optimizer:
    """A replicated optimizer of the same class over the same parameter groups (no state)."""
    groups = [dict(group) for group in zero.param_groups]
    return zero._optim_constructor(groups, **zero._optim_defaults)


def full_state_dict(zero: ZeroRedundancyOptimizer, model: nn.Module | list[nn.Module]) -> dict[str, Any]:
    """The replicated optimizer's state dict (parameter names as keys), gathered from every rank's shard.

    Collective: every rank calls it. Each rank ends up with the full state (as plain DDP holds it).
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    full: dict[str, Any] = {}
    for rank in range(dist.get_world_size()):  # each call gathers on one rank and clears the others' copies
        zero.consolidate_state_dict(to=rank)
        if rank == dist.get_rank():
            full = zero.state_dict()
    plain = _plain_copy(zero)
    if full["state"]:
        plain.load_state_dict(full)
    zero._all_state_dicts = []  # free the gathered copy
    return get_optimizer_state_dict(model, plain)


def load_full_state_dict(zero: ZeroRedundancyOptimizer, model: nn.Module | list[nn.Module],
                         state: dict[str, Any]) -> None:
    """Load a replicated optimizer state dict (parameter names as keys); each rank keeps its own shard."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    plain = _plain_copy(zero)
    set_optimizer_state_dict(model, plain, state)
    zero.load_state_dict(plain.state_dict())
