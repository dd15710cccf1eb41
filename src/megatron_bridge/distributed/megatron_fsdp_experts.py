"""Mixture-of-experts models under Megatron FSDP: the expert mesh megatron-fsdp shards the routed experts over, and
the checkpoint view of expert parameters split over expert-parallel ranks.

Layout. With PP = 1 and ETP 1 (rules ``pipeline_megatron_fsdp``, ``megatron_fsdp_expert_tensor_parallel``) the
experts are split over ``model.expert_model_parallel_size`` ranks folded over the data × context × tensor-parallel
ranks, as under DDP and FSDP2 (:mod:`.expert_parallel`: ``expert_rank_grid``, rank = edp index × EP + ep index;
with TP > 1 each TP rank routes its own tokens). megatron-fsdp 0.6.1 treats every
parameter whose name contains ``.experts.`` (the routed experts' weights and biases of every MoE layer) as an expert
parameter: it puts them in buckets of their own, sharded over, and reduced over, the ``"dp_cp"`` dimension of its
``expt_device_mesh`` (``FSDPDistributedIndex``, ``get_fsdp_group(is_expert_parallel=True)``). :func:`expert_device_mesh`
gives it the ``("dp_cp", "tp")`` mesh whose ``"dp_cp"`` groups are the expert-data-parallel groups (``"edp"``: the
ranks holding the same experts) and whose ``"tp"`` is 1 (ETP 1), as megatron-core's adapter builds it from its
expert groups. At EP = 1 the experts are ordinary TP-replicated parameters seeing the TP group's tokens: the expert
mesh is then the dense ``(dp × cp, TP)`` one. Expert gradients are pre-scaled by 1 / (dp × cp) and summed over
``"edp"`` (megatron-fsdp's ``expert_gradient_scaling_factor`` without ``average_in_collective``, which Megatron FSDP
turns off): the sum over the ranks of a stage that together see every token once, divided by the data-parallel
size, the same as :meth:`~.expert_parallel.ExpertParallel.reduce_grads` under DDP.

Checkpoints (:class:`ExpertCheckpointView`). megatron-fsdp's state dicts hold each expert parameter (and its
optimizer state) as a DTensor of the EP rank's ``[E / EP, ...]`` experts, sharded (unevenly, flat buckets) over
``"edp"``. With EP > 1 those would collide between EP ranks, so the view gives each the global ``[E, ...]`` shape,
its DCP chunk moved to the EP rank's experts (offset ``ep_rank × E / EP`` on dimension 0, no copy, no
communication): the checkpoint holds the same global expert tensors as DDP's and FSDP2's. :meth:`localize` gives the
loaded DTensors back their live shape before megatron-fsdp installs them.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from megatron_bridge.distributed.expert_parallel import ExpertParallel, expert_rank_grid
from megatron_bridge.distributed.megatron_fsdp_compat import MESH_DIM_NAMES


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.distributed.init import DistEnv


EXPERT_MESH_DIMS = ("ep", *MESH_DIM_NAMES)
"""The full expert mesh ``("ep", "dp_cp", "tp")``; megatron-fsdp gets its ``("dp_cp", "tp")`` sub-mesh."""


def expert_rank_layout(world_size: int, ep: int, tp: int = 1) -> torch.Tensor:
    """Global ranks of the expert mesh, shape ``(ep, edp, 1)``: :func:`~.expert_parallel.expert_rank_grid` (PP 1,
    ETP 1) with the ``"ep"`` dimension first, so that each ``"dp_cp"`` row is one expert-data-parallel group (EP
    folded over the ``tp`` ranks too). At EP 1 the experts are TP-replicated parameters that see the TP group's
    tokens: the layout is then the dense one, ``(1, world / tp, tp)``."""
    if ep == 1:
        return torch.arange(world_size).reshape(1, world_size // tp, tp)
    return expert_rank_grid(world_size, 1, ep, 1)[0].permute(1, 0, 2).contiguous()


def expert_device_mesh(cfg: "ConfigContainer", env: "DistEnv") -> DeviceMesh:
    """megatron-fsdp's ``expt_device_mesh`` (module docstring): the ``("dp_cp", "tp")`` sub-mesh of this rank's
    expert-data-parallel group and a size-1 TP dimension (ETP 1; at EP 1 the dense mesh). A collective: every rank
    calls it."""
    m = cfg.model
    layout = expert_rank_layout(env.world_size, m.expert_model_parallel_size, m.tensor_model_parallel_size)
    mesh = DeviceMesh(env.device.type, layout, mesh_dim_names=EXPERT_MESH_DIMS)
    return mesh[MESH_DIM_NAMES]


@dataclass
class ExpertCheckpointView:
    """The global checkpoint view of the EP-split expert parameters of a Megatron FSDP model (module docstring)."""

    names: frozenset[str]
    """Fully qualified names of the expert parameters split over EP ranks (the model state dict's keys)."""
    ep_rank: int
    ep_size: int

    @classmethod
    def of(cls, experts: ExpertParallel | None) -> "ExpertCheckpointView | None":
        """The view for ``experts`` (None at EP 1: megatron-fsdp's DTensors are global already)."""
        if experts is None or experts.mesh["ep"].size() == 1:
            return None
        names = frozenset(name for chunk in experts.params for name in chunk)
        return cls(names, experts.mesh["ep"].get_local_rank(), experts.mesh["ep"].size())

    def globalize(self, state: dict[str, Any]) -> dict[str, Any]:
        """A model state dict (``name → DTensor``) with the expert parameters in their global shape."""
        return {k: self._global(v) if k in self.names and _is_tensor(v) else v for k, v in state.items()}

    def globalize_optimizer(self, state: dict[str, Any]) -> dict[str, Any]:
        """A nested optimizer state dict (``{"state": {name: {key: tensor}}, ...}``) with the state tensors of the
        expert parameters in their global shape (new containers; the live state is untouched)."""
        per_param = {name: ({key: self._global(v) if _is_tensor(v) else v for key, v in entry.items()}
                            if name in self.names and isinstance(entry, dict) else entry)
                     for name, entry in state.get("state", {}).items()}
        return {**state, "state": per_param}

    def localize(self, state: dict[str, Any]) -> dict[str, Any]:
        """:meth:`globalize`'s result (model or optimizer, after DCP filled it in place) with the live, EP-rank
        shapes again (the same local storage)."""
        out: dict[str, Any] = {}
        for key, value in state.items():
            if isinstance(value, dict):
                out[key] = self.localize(value)
            elif _is_tensor(value) and value.shape[0] % self.ep_size == 0 and _is_global(value):
                out[key] = self._local(value)
            else:
                out[key] = value
        return out

    def _global(self, value: DTensor) -> DTensor:
        local = value._local_tensor
        chunk = (local.__create_chunk_list__() if hasattr(local, "__create_chunk_list__")
                 else value.__create_chunk_list__())[0]
        shape = torch.Size([value.shape[0] * self.ep_size, *value.shape[1:]])
        meta = ChunkStorageMetadata(offsets=torch.Size([chunk.offsets[0] + self.ep_rank * value.shape[0],
                                                        *chunk.offsets[1:]]), sizes=chunk.sizes)
        view = DTensor.from_local(local.detach(), value.device_mesh, value.placements, run_check=False, shape=shape,
                                  stride=_contiguous_stride(shape))
        view._local_tensor.__create_chunk_list__ = lambda: [meta]
        view._local_tensor.__create_write_items__ = _write_items(meta, shape)
        view._local_tensor._mb_global_expert = True
        return view

    def _local(self, value: DTensor) -> DTensor:
        shape = torch.Size([value.shape[0] // self.ep_size, *value.shape[1:]])
        return DTensor.from_local(value._local_tensor, value.device_mesh, value.placements, run_check=False,
                                  shape=shape, stride=_contiguous_stride(shape))


def _is_tensor(value: Any) -> bool:
    return isinstance(value, DTensor) and value.ndim >= 1


def _is_global(value: DTensor) -> bool:
    return getattr(value._local_tensor, "_mb_global_expert", False)


def _contiguous_stride(shape: torch.Size) -> tuple[int, ...]:
    return torch.empty(shape, device="meta").stride()


def _write_items(meta: ChunkStorageMetadata, shape: torch.Size) -> Any:
    def write_items(fqn: str, tensor: DTensor) -> list[WriteItem]:
        local = tensor.to_local()
        if local.numel() == 0:  # this rank holds no part of the EP rank's experts
            return []
        return [WriteItem(type=WriteItemType.SHARD, index=MetadataIndex(fqn, meta.offsets),
                          tensor_data=TensorWriteData(chunk=meta, properties=TensorProperties.create_from_tensor(local),
                                                      size=shape))]

    return write_items
