"""Tied input/output embeddings under pipeline parallelism, as Megatron does them.

With ``model.share_embeddings_and_output_weights`` and PP > 1 the first stage holds the embedding and the last stage
a copy of it as its output weight (both under the PP=1 model's embedding name, so checkpoints keep the PP=1 keys:
DCP writes the identical entries once and both stages read them back; :mod:`megatron_bridge.models.pipeline_stage`
builds the copy). :class:`TiedEmbeddings` keeps the two equal:

* after the data-parallel backend wrapped (and, with ``model.init_model_with_meta_device``, initialized) the chunks,
  the first stage's weight is broadcast to the last stage over the *embedding group*: the first-stage and the
  last-stage rank at the same data/context/tensor-parallel position (the pipeline group itself at PP = 2);
* after each step's gradients are reduced over data parallelism, the two gradients are summed over that group, so
  both copies get the gradient of the tied weight and the optimizer updates them alike;
* the gradient and parameter norms count the weight once (the last stage's copy is left out, as Megatron's
  ``param_is_not_shared``).

Each rank works on its local tensors (DTensor shards of FSDP2 or ``replicate``, tensor-parallel shards): the stages
are sharded alike over the same data/tensor-parallel sizes, so local shards line up. The V schedules (first and last
stage on one rank) are refused by rule ``pipeline_tied_embeddings``.
"""

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from megatron_bridge.config.decoder_names import EMBEDDING
from megatron_bridge.models.experts import local_tensor
from megatron_bridge.utils.logging import get_logger, log_rank_0


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

logger = get_logger(__name__)


def embedding_groups(pp: int, world_size: int, pp_group: dist.ProcessGroup) -> dist.ProcessGroup:
    """This rank's embedding group (collective over the world when PP > 2: every group is created on every rank).

    Global rank ``pp_rank × (world / PP) + position`` (:func:`~megatron_bridge.distributed.init.build_device_mesh`),
    so the group of position ``j`` is ``[j, (PP − 1) × world / PP + j]``.
    """
    if pp == 2:
        return pp_group
    per_stage = world_size // pp
    ranks = [[j, (pp - 1) * per_stage + j] for j in range(per_stage)]
    group, _ = dist.new_subgroups_by_enumeration(ranks)
    return group


class TiedEmbeddings:
    """The tied embedding weight of this rank's first or last pipeline stage and its embedding group.

    Args:
        weight: the embedding weight of the first stage, or the last stage's copy (``is_copy``).
        is_copy: True on the last stage.
        group: the embedding group (first-stage rank and last-stage rank).
    """

    def __init__(self, weight: nn.Parameter | None, is_copy: bool, group: dist.ProcessGroup | None) -> None:
        self.weight = weight
        self.is_copy = is_copy
        self.group = group

    @classmethod
    def build(cls, cfg: "ConfigContainer", chunks: list[nn.Module], pp_group: dist.ProcessGroup | None
              ) -> "TiedEmbeddings | None":
        """The tied state of ``chunks`` (unwrapped stage modules of this rank), or None when the model is not tied or
        not pipelined. Collective (all ranks call it): creates the embedding groups at PP > 2."""
        m = cfg.model
        if pp_group is None or m.pipeline_model_parallel_size <= 1 or not m.share_embeddings_and_output_weights:
            return None
        group = embedding_groups(m.pipeline_model_parallel_size, dist.get_world_size(), pp_group)
        for chunk in chunks:
            spec = getattr(chunk, "pipeline_stage", None)
            embedding = getattr(chunk, EMBEDDING, None)
            if spec is not None and embedding is not None and (spec.is_first or spec.is_last):
                return cls(embedding.weight, not spec.is_first, group)
        return cls(None, False, None)  # a middle stage: not in any embedding group

    @torch.no_grad()
    def broadcast_weight(self) -> None:
        """Copy the first stage's weight into the last stage's copy (local shards; after initialization)."""
        if self.weight is None or self.group is None:
            return
        src = dist.get_global_rank(self.group, 0)  # the first stage's rank: the lower global rank of the pair
        local = local_tensor(self.weight)
        buffer = local.contiguous()
        dist.broadcast(buffer, src=src, group=self.group)
        if buffer.data_ptr() != local.data_ptr():
            local.copy_(buffer)
        log_rank_0(logger, "tied embeddings: the last pipeline stage's copy of %s.weight set from the first stage",
                   EMBEDDING)

    @torch.no_grad()
    def reduce_grads(self) -> None:
        """Sum the tied weight's gradient over the embedding group (after the data-parallel reduction)."""
        if self.weight is None or self.group is None:
            return
        if self.weight.grad is None:
            self.weight.grad = torch.zeros_like(self.weight)
        grad = local_tensor(self.weight.grad)
        buffer = grad.contiguous()
        dist.all_reduce(buffer, group=self.group)
        if buffer.data_ptr() != grad.data_ptr():
            grad.copy_(buffer)

    def counted(self, params: list[nn.Parameter]) -> list[nn.Parameter]:
        """``params`` without the last stage's copy (norms count the tied weight once)."""
        if not self.is_copy or self.weight is None:
            return params
        return [p for p in params if p is not self.weight]
