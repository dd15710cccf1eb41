"""The TP group's split of an MoE layer's tokens under MoE parallel folding (``expert_tensor_parallel_size=1``,
EP > 1, TP > 1): each TP rank routes and dispatches only its part of the tokens, so a token reaches its experts
once, not once per TP rank.

With sequence parallelism the rank's part is the sequence shard the layer receives (nothing to split or gather).
Without it the layer receives the TP group's tokens replicated: :meth:`TensorParallelTokens.scatter` keeps the
rank's ``1/TP`` slice of the sequence dimension (backward: all-gather of the slices' gradients, so the replicated
input gets the whole gradient on every TP rank) and :meth:`TensorParallelTokens.gather` concatenates the routed
outputs of the TP ranks (backward: the rank's slice of the gradient, a plain split and no reduction, because the
gradients arriving at a replicated output are identical on the TP ranks).
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist


def seq_slice(x: torch.Tensor, size: int, rank: int, dim: int = 1) -> torch.Tensor:
    """Rank ``rank``'s contiguous ``1/size`` part of ``x`` along ``dim`` (a copy)."""
    chunk = x.shape[dim] // size
    return x.narrow(dim, rank * chunk, chunk).contiguous()


def _all_gather(x: torch.Tensor, group: dist.ProcessGroup, size: int, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


class _ScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, group: dist.ProcessGroup, size: int,
                rank: int) -> torch.Tensor:
        ctx.group, ctx.size = group, size  # type: ignore[attr-defined]
        return seq_slice(x, size, rank)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple:
        return _all_gather(grad, ctx.group, ctx.size, 1), None, None, None  # type: ignore[attr-defined]


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, y: torch.Tensor, group: dist.ProcessGroup, size: int,
                rank: int) -> torch.Tensor:
        ctx.size, ctx.rank = size, rank  # type: ignore[attr-defined]
        return _all_gather(y, group, size, 1)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple:
        return seq_slice(grad, ctx.size, ctx.rank), None, None, None  # type: ignore[attr-defined]


@dataclass
class TensorParallelTokens:
    """How one TP rank takes its part of an MoE layer's ``[b, s, hidden]`` input and gives back the routed output
    (module docstring)."""

    group: dist.ProcessGroup
    size: int
    rank: int
    sequence_parallel: bool

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        """The rank's tokens: ``x`` itself under sequence parallelism, else its slice of the sequence."""
        if self.sequence_parallel:
            return x
        return _ScatterSeq.apply(x, self.group, self.size, self.rank)

    def gather(self, y: torch.Tensor) -> torch.Tensor:
        """The layer's output layout: ``y`` itself under sequence parallelism, else the TP ranks' slices joined."""
        if self.sequence_parallel:
            return y
        return _GatherSeq.apply(y, self.group, self.size, self.rank)
