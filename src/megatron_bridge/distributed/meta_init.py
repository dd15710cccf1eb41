"""Materialize a meta-device model whose parameters are already sharded DTensors (FSDP2), shard by shard.

``to_empty`` allocates only each rank's shard. ``init_weights`` then runs under :class:`ShardedInitMode`: every
random (or ``torch.nn.init``) fill of a DTensor is computed on a full-size temporary tensor on the compute device
— drawing from torch's global generator exactly as an unsharded build does — and only the local shard is kept.
So with the same seed the full parameters equal a direct (non-meta) build bit for bit, while at most one full
parameter is alive at a time.
"""

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.overrides import TorchFunctionMode

from megatron_bridge.models.provider import materialize_meta_model


RANDOM_FILLS = frozenset({
    torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.random_, torch.Tensor.exponential_,
    torch.Tensor.geometric_, torch.Tensor.log_normal_, torch.Tensor.cauchy_, torch.Tensor.bernoulli_,
})
"""In-place random fills of a tensor method."""


def _is_sharded_fill(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    target = args[0] if args else kwargs.get("tensor")
    if not isinstance(target, DTensor):
        return False
    return func in RANDOM_FILLS or getattr(func, "__module__", "") == "torch.nn.init"


class ShardedInitMode(TorchFunctionMode):
    """Make in-place initializers of DTensors produce the shards of what an unsharded initialization produces."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if not _is_sharded_fill(func, args, kwargs):
            return func(*args, **kwargs)
        args = tuple(args)
        if args:
            target, rest = args[0], args[1:]
        else:
            target, rest = kwargs.pop("tensor"), ()
        full = torch.empty(target.shape, dtype=target.dtype, device=self.device)
        func(full, *rest, **kwargs)
        shard = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None).to_local()
        with torch.no_grad():
            target.to_local().copy_(shard)
        return target


def materialize_sharded(module: nn.Module, device: torch.device) -> nn.Module:
    """``to_empty(device)`` + ``init_weights()`` of a fully_shard-ed meta model; see the module docstring."""
    with ShardedInitMode(device):
        materialize_meta_model(module, device)
    return module
