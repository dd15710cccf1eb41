"""Context parallelism (CP): wiring the model for it.

With ``model.context_parallel_size = P > 1`` every sequence is cut into ``2P`` chunks and CP rank ``r`` holds chunks
``r`` and ``2P - 1 - r`` (the zig-zag layout, :mod:`megatron_bridge.data.zigzag`, which the data loaders apply to
every batch).

* :func:`apply_context_parallel` — attaches :class:`~megatron_bridge.distributed.cp_attention.ContextParallelAttention`
  to every attention module of the model and the layout to the model (RoPE positions default to the zig-zag
  positions).

The attention itself (all-gather-KV, or PyTorch's ring attention on CUDA) is in :mod:`.cp_attention`; gradients of
the replicated parameters are reduced over the flattened ``dp × cp`` mesh by the data-parallel backends.
"""

from typing import TYPE_CHECKING

from torch import nn

from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.utils.logging import get_logger, log_rank_0


if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from megatron_bridge.config.container import ConfigContainer

logger = get_logger(__name__)


# ---------------------------------------------------------------------------------------------- model wiring
def context_parallel_rank(cfg: "ConfigContainer", rank: int) -> int:
    """This rank's index in the ``"cp"`` mesh dimension (layout ``("dp", "cp", "tp")``, TP innermost)."""
    tp, cp = cfg.model.tensor_model_parallel_size, cfg.model.context_parallel_size
    return (rank // tp) % cp


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    from megatron_bridge.models.llama import LlamaAttention
    from megatron_bridge.models.mla import MultiLatentAttention

    return [m for m in model.modules() if isinstance(m, (LlamaAttention, MultiLatentAttention))]


def _routers(model: nn.Module) -> list[nn.Module]:
    from megatron_bridge.models.moe import TopKRouter

    return [m for m in model.modules() if isinstance(m, TopKRouter)]


def apply_context_parallel(model: nn.Module, cp_mesh: "DeviceMesh", cfg: "ConfigContainer") -> int:
    """Make ``model`` run under context parallelism over ``cp_mesh``; returns the number of attention modules.

    Every attention module gets a ``context_parallel`` attribute (the CP attention of ``model.cp_comm_type``), every
    MoE router the CP group (its load-balancing loss is over the whole sequence, see
    :class:`~megatron_bridge.models.moe.TopKRouter`); the model gets ``cp_layout = (cp_size, cp_rank)`` so
    forward calls without ``position_ids`` use the zig-zag absolute positions. Parameters are untouched:
    checkpoints do not depend on CP.

    Raises:
        ConfigValidationError: the mesh size differs from ``model.context_parallel_size``, or the model has no
            attention modules.
    """
    from megatron_bridge.distributed.cp_attention import ContextParallelAttention

    cp = cfg.model.context_parallel_size
    if cp_mesh.size() != cp:
        raise ConfigValidationError(
            f"the CP mesh has {cp_mesh.size()} ranks but model.context_parallel_size={cp}.",
            ("model.context_parallel_size",),
        )
    comm = cfg.model.cp_comm_type  # the backends enforce rule cp_ring_needs_cuda before they call this
    modules = _attention_modules(model)
    if not modules:
        raise ConfigValidationError(
            f"model.context_parallel_size={cp}: {type(model).__name__} has no attention modules (the shared "
            "decoder's LlamaAttention) to run under context parallelism; set model.context_parallel_size=1.",
            ("model.context_parallel_size",),
        )
    attention = ContextParallelAttention(cp_mesh, comm)
    for module in modules:
        module.context_parallel = attention
    for router in _routers(model):  # MoE: the load-balancing loss counts the tokens of the whole sequence
        router.cp_group, router.cp_size = cp_mesh.get_group(), cp
    model.cp_layout = (cp, cp_mesh.get_local_rank())
    log_rank_0(logger, "CP: %d attention modules over %d ranks (zig-zag layout, cp_comm_type=%s)", len(modules), cp,
               comm)
    return len(modules)
