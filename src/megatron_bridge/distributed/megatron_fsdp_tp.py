"""Tensor parallelism (``model.tensor_model_parallel_size > 1``) under Megatron FSDP: the ``("dp_cp", "tp")`` mesh
megatron-fsdp shards over, the TP plan applied before it, and what the backend needs to count TP-split gradients.

Mesh. megatron-fsdp 0.6.1 takes a device mesh with a data-parallel dimension (``dp_shard_dim``, here ``"dp_cp"``:
the flattened data × context-parallel group, as megatron-core's adapter names it) and a ``tp_dim``.
:func:`fsdp_mesh_shape` gives ``(world / TP, TP)``: with the layout's TP innermost (:func:`.init.build_device_mesh`)
its rows are the layout's data × context-parallel groups and its columns the TP groups (:func:`check_same_groups`).

Order (torchtitan's, as FSDP2): expert parallelism first (EP folded over the TP ranks: it gets the TP mesh so each TP
rank routes its own tokens), then :func:`~.tensor_parallel.apply_tensor_parallel` over ``"tp"`` (the same plan as
FSDP2: ``fsdp2.tp_plan`` or the auto Llama plan, sequence parallelism included), then ``fully_shard_model``. A
parameter that TP split (``Shard(k)`` on ``"tp"``) keeps that placement: megatron-fsdp shards its local part over
``"dp_cp"`` and gives it the ``("dp_cp", "tp")`` placements ``[Shard(0), Shard(k)]``; parameters replicated over TP
(norms, router) are DTensors on the ``"dp_cp"`` dimension only (megatron-fsdp drops a TP dimension without a
shard); the expert-parallel experts (plain, whole with ETP 1) are sharded
over the expert-data-parallel group only.

Parameters. megatron-fsdp 0.6.1 accepts DTensor parameters but views each local shard as
``(-1, *param.shape[1:])`` with the *global* shape (``make_fsdp_dtensor``), which is wrong for a parameter split on
a dimension other than 0 (the row-wise layers' ``Shard(1)``: ``validate_uneven_dtensor`` fails). It handles
megatron-core's TP parameters instead: plain local tensors with ``tensor_model_parallel`` / ``partition_dim``
attributes, for which it builds the ``("dp_cp", "tp")`` DTensors itself. :func:`local_tensor_parallel_params`
turns each TP DTensor parameter into such a plain parameter (same storage) and gives its module a view that builds
the DTensor with ``DTensor.from_local`` at every access, so the TP plan's forward is unchanged and the gradient
reaches the plain parameter with the parameter's placements (``from_local``'s backward turns a ``Partial`` gradient,
e.g. of a norm under sequence parallelism, into the replicated sum over ``"tp"``). The state dict keys stay the
same (the view class is a subclass of the module's class with the same name).

Gradient norm. :func:`grad_copies` counts how many ranks of the stage hold each gradient shard, so the backend sums
``shard² / copies`` over all ranks once.
"""

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

from megatron_bridge.errors import MegatronBridgeError


def fsdp_mesh_shape(world_size: int, tp: int) -> tuple[int, int]:
    """megatron-fsdp's ``("dp_cp", "tp")`` mesh shape: ``(world / TP, TP)``.

    Raises:
        MegatronBridgeError: TP does not divide the world size (rule ``world_size_divisible`` names it first).
    """
    if tp < 1 or world_size % tp:
        raise MegatronBridgeError(f"Megatron FSDP: model.tensor_model_parallel_size={tp} must divide the world size "
                                  f"{world_size}.")
    return world_size // tp, tp


def check_same_groups(fsdp_mesh: DeviceMesh, reduce_mesh: DeviceMesh, tp_mesh: DeviceMesh | None) -> None:
    """Raise unless megatron-fsdp's ``"dp_cp"`` and ``"tp"`` groups of this rank are the layout's (``reduce_mesh``:
    ``"dp"`` or ``"dp_cp"``; ``tp_mesh``: ``"tp"``, None at TP 1)."""
    pairs = [("dp_cp", reduce_mesh)] + ([("tp", tp_mesh)] if tp_mesh is not None else [])
    for name, layout in pairs:
        ours = dist.get_process_group_ranks(fsdp_mesh.get_group(name))
        if ours != dist.get_process_group_ranks(layout.get_group()):
            raise MegatronBridgeError(f"Megatron FSDP: megatron-fsdp's {name!r} group {ours} differs from the "
                                      "layout's (a layout with PP > 1?).")


class _TensorParallelView:
    """A data descriptor: the module's (plain, TP-local) parameter ``name`` seen as its TP DTensor, built with the
    autograd-aware ``DTensor.from_local`` at every access (parameters megatron-fsdp already replaced by its own
    DTensors are returned as they are)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, module: nn.Module | None, owner: type) -> Any:
        if module is None:
            return self
        local = module._parameters[self.name]
        if local is None or isinstance(local, DTensor):
            return local
        mesh, placements, shape, stride = module._mb_tp_specs[self.name]
        return DTensor.from_local(local, mesh, placements, run_check=False, shape=shape, stride=stride)


_VIEW_CLASSES: dict[tuple[type, frozenset[str]], type] = {}


def _view_class(cls: type, names: frozenset[str]) -> type:
    key = (cls, names)
    if key not in _VIEW_CLASSES:
        attrs: dict[str, Any] = {n: _TensorParallelView(n) for n in names}
        attrs["__qualname__"] = cls.__qualname__
        attrs["__module__"] = cls.__module__
        _VIEW_CLASSES[key] = type(cls.__name__, (cls,), attrs)
    return _VIEW_CLASSES[key]


def local_tensor_parallel_params(model: nn.Module) -> int:
    """Give megatron-fsdp the TP-local parameters it expects (module docstring): every DTensor parameter of
    ``model`` (one ``"tp"`` placement) becomes a plain parameter over the same storage with megatron-core's TP
    attributes (``tensor_model_parallel``, ``partition_dim``, ``partition_stride``; TP-replicated ones are
    "duplicated": ``tensor_model_parallel=False``), and its module reads it as the DTensor it was. Returns the
    number of parameters converted.

    Raises:
        MegatronBridgeError: a parameter with a placement other than ``Shard``/``Replicate`` on a 1-D mesh.
    """
    count = 0
    for module in list(model.modules()):
        specs: dict[str, tuple[DeviceMesh, tuple[Placement, ...], torch.Size, tuple[int, ...]]] = {}
        for name, param in list(module._parameters.items()):
            if not isinstance(param, DTensor):
                continue
            placement = param.placements[0] if len(param.placements) == 1 else None
            if not isinstance(placement, (Shard, Replicate)):
                raise MegatronBridgeError(f"Megatron FSDP with TP: parameter {name!r} of {type(module).__name__} "
                                          f"has placements {param.placements}; only one Shard or Replicate is "
                                          "supported.")
            local = nn.Parameter(param._local_tensor.detach(), requires_grad=param.requires_grad)
            local.tensor_model_parallel = isinstance(placement, Shard)  # type: ignore[attr-defined]
            local.partition_dim = placement.dim if isinstance(placement, Shard) else -1  # type: ignore[attr-defined]
            local.partition_stride = 1  # type: ignore[attr-defined]
            specs[name] = (param.device_mesh, tuple(param.placements), param.shape, param.stride())
            module._parameters[name] = local
            count += 1
        if specs:
            module._mb_tp_specs = specs
            module.__class__ = _view_class(type(module), frozenset(specs))
    return count


def grad_copies(grad: torch.Tensor, world_size: int, ep_size: int = 1) -> int:
    """How many of the stage's ``world_size`` ranks hold the same shard as this rank's ``grad``: the sizes of the
    dimensions it is replicated over on its mesh, times the ranks outside its mesh that hold the same values (TP
    ranks for a parameter sharded over ``"dp_cp"`` only). ``ep_size``: the expert-parallel size for an expert
    parameter split over EP ranks (those ranks hold different experts), else 1. A plain tensor is on every rank."""
    if not isinstance(grad, DTensor):
        return world_size
    mesh = grad.device_mesh
    replicated = math.prod(mesh.size(i) for i, p in enumerate(grad.placements) if p.is_replicate())
    return replicated * max(1, world_size // (mesh.size() * ep_size))
