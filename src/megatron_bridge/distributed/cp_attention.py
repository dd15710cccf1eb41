"""Causal attention under context parallelism, behind one interface (:class:`ContextParallelAttention`).

``model.cp_comm_type`` selects the implementation (Megatron's field name and meaning):

* ``"all_gather"`` (default, every device): queries stay local; keys and values of the CP group are all-gathered
  with an autograd function whose backward is a reduce-scatter (:func:`all_gather_sequence`). Under grouped-query
  attention only the KV heads travel. The gathered keys are put in sequence order and each local chunk ``c`` of the
  zig-zag layout attends to the causal prefix ``[0, (c+1)·C)`` with a mask built from absolute positions
  (:func:`all_gather_attention`); an optional ``segment_ids`` tensor (padding / end-of-document masking) restricts
  attention to keys of the same segment. Exact: it computes what one process computes, in the same order per row.
* ``"p2p"`` (CUDA only): PyTorch's ring attention, ``torch.distributed.tensor.experimental.context_parallel``, whose
  head-tail load balancer is the same zig-zag layout. It overlaps the KV exchange with compute; it has no custom
  masks (``segment_ids`` raise) and gets the KV heads repeated to the query heads.
"""

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.nn import functional as F

from megatron_bridge.data.zigzag import gathered_positions, query_blocks, zigzag_chunk_ids
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.models import attention
from megatron_bridge.models.attention import band_mask


if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch >= 2.13 renamed them
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _AllGatherSequence(torch.autograd.Function):
    """All-gather along dim 0 over ``group``; backward reduce-scatters (sums) the gradient back to each rank."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:  # noqa: ANN001
        ctx.group = group
        world = dist.get_world_size(group)
        out = x.new_empty((world * x.shape[0], *x.shape[1:]))
        _all_gather(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        world = dist.get_world_size(ctx.group)
        out = grad.new_empty((grad.shape[0] // world, *grad.shape[1:]))
        _reduce_scatter(out, grad.contiguous(), op=dist.ReduceOp.SUM, group=ctx.group)
        return out, None


def all_gather_sequence(x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    """``x`` of every rank of ``group`` concatenated along ``dim`` (rank order), differentiable: the gradient of each
    rank's ``x`` is the sum over ranks of the gradient of its part (a reduce-scatter)."""
    moved = x.movedim(dim, 0)
    if not moved.requires_grad:
        world = dist.get_world_size(group)
        out = moved.new_empty((world * moved.shape[0], *moved.shape[1:]))
        _all_gather(out, moved.contiguous(), group=group)
        return out.movedim(0, dim)
    return _AllGatherSequence.apply(moved, group).movedim(0, dim)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """One-process causal attention (``[b, heads, s, d]``; GQA when ``k`` has fewer heads), optionally restricted to
    keys with the same ``segment_ids`` (``[b, s]``) as the query."""
    if segment_ids is None:
        return attention.causal_attention(q, k, v)
    pos = torch.arange(q.shape[2], device=q.device)
    mask = band_mask(pos, pos, None) & (segment_ids[:, :, None] == segment_ids[:, None, :])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=k.shape[1] != q.shape[1])


def all_gather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup, cp_rank: int,
                         segment_ids: torch.Tensor | None = None, window: int | None = None,
                         sinks: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
    """Causal attention of this rank's zig-zag queries over the whole sequence (module docstring).

    Args:
        q: local queries ``[b, heads, s_local, d]`` (chunks ``r`` and ``2P-1-r``, in that order).
        k, v: local keys/values ``[b, kv_heads, s_local, d]``.
        group: the CP process group (``P`` ranks).
        cp_rank: this rank's index in ``group``.
        segment_ids: optional local segment ids ``[b, s_local]``; a query attends only to keys of its segment.
        window: optional sliding window (tokens including the query's own; :mod:`megatron_bridge.models.attention`).
        sinks: optional per-head sink logits ``[heads]`` (:mod:`megatron_bridge.models.attention_sinks`); each rank's
            queries join them to their softmax, so their gradient is this rank's part (summed over CP by the
            data-parallel gradient reduction).
        softcap: optional soft-capping of the scores (:mod:`megatron_bridge.models.softcapping`, Gemma 2).

    Returns:
        ``[b, heads, s_local, d]``, equal to the rows of one-process causal attention at this rank's positions.
    """
    cp = dist.get_world_size(group)
    s_local = q.shape[2]
    seq_len = s_local * cp
    chunk = seq_len // (2 * cp)
    order = torch.argsort(gathered_positions(seq_len, cp, device=q.device))
    k_seq = all_gather_sequence(k, group, dim=2).index_select(2, order)
    v_seq = all_gather_sequence(v, group, dim=2).index_select(2, order)
    seg_seq = all_gather_sequence(segment_ids, group, dim=1).index_select(1, order) if segment_ids is not None else None
    gqa = k.shape[1] != q.shape[1]
    outs = []
    for block in query_blocks(zigzag_chunk_ids(cp, cp_rank), chunk):
        rows = slice(block.q_start, block.q_start + block.q_len)
        q_pos = block.chunk * chunk + torch.arange(block.q_len, device=q.device)
        mask = band_mask(q_pos, torch.arange(block.kv_len, device=q.device), window)
        if seg_seq is not None and segment_ids is not None:
            same = segment_ids[:, rows, None] == seg_seq[:, None, : block.kv_len]
            mask = (mask[None] & same)[:, None]
        q_rows, k_rows, v_rows = q[:, :, rows], k_seq[:, :, : block.kv_len], v_seq[:, :, : block.kv_len]
        outs.append(attention.masked_attention(q_rows, k_rows, v_rows, mask, gqa, sinks, softcap))
    return torch.cat(outs, dim=2)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp_mesh: "DeviceMesh") -> torch.Tensor:
    """PyTorch's ring attention (CUDA only) on zig-zag-laid-out local ``q, k, v`` (``[b, heads, s_local, d]``).

    ``context_parallel`` shards its buffers itself; we hand it a throw-away buffer of the global sequence length
    only so that its default head-tail load balancer (our zig-zag layout) is selected, then call SDPA inside it.
    """
    from torch.distributed.tensor.experimental import context_parallel

    if k.shape[1] != q.shape[1]:  # ring attention has no GQA: repeat the KV heads to the query heads
        repeats = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
    marker = torch.empty(q.shape[2] * cp_mesh.size(), device=q.device)
    with context_parallel(cp_mesh, buffers=[marker], buffer_seq_dims=[0], no_restore_buffers={marker}):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class ContextParallelAttention:
    """The attention a model's attention modules call under CP (set by
    :func:`~megatron_bridge.distributed.context_parallel.apply_context_parallel`).

    Args:
        cp_mesh: the 1-D ``"cp"`` mesh.
        comm_type: ``"all_gather"`` or ``"p2p"`` (``model.cp_comm_type``).
    """

    def __init__(self, cp_mesh: "DeviceMesh", comm_type: str) -> None:
        if comm_type not in ("all_gather", "p2p"):  # model.cp_comm_type: rule field_types
            raise ValueError(f"comm_type={comm_type!r}: use 'all_gather' (every device) or 'p2p' (CUDA ring attention)")
        self.mesh = cp_mesh
        self.group = cp_mesh.get_group()
        self.size = cp_mesh.size()
        self.rank = cp_mesh.get_local_rank()
        self.comm_type = comm_type

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 segment_ids: torch.Tensor | None = None, window: int | None = None,
                 sinks: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
        """Causal attention of the local zig-zag queries over the whole sequence (within ``window`` tokens when
        given, with the per-head ``sinks`` when given, the scores soft-capped at ``softcap`` when given; ring
        attention has none of them: rules ``attention_window``, ``attention_sinks`` and ``logit_softcapping``)."""
        if self.comm_type == "p2p":
            if segment_ids is not None:
                raise ConfigValidationError(
                    "model.cp_comm_type='p2p' (ring attention) supports only the plain causal mask, and this batch "
                    "has segment_ids (padding / end-of-document masking): use model.cp_comm_type='all_gather'.",
                    ("model.cp_comm_type",),
                )
            return ring_attention(q, k, v, self.mesh)
        return all_gather_attention(q, k, v, self.group, self.rank, segment_ids, window, sinks, softcap)

    def __repr__(self) -> str:
        return f"ContextParallelAttention(size={self.size}, rank={self.rank}, comm_type={self.comm_type!r})"
