"""The parallel layout of a config as the memory model sees it: sizes of every parallel dimension, read defensively.

Pipeline, context and expert parallelism are read from the config's fields with Megatron's names
(``pipeline_model_parallel_size``, ``virtual_pipeline_model_parallel_size``, ``context_parallel_size``,
``expert_model_parallel_size``, ``expert_tensor_parallel_size``, ``num_moe_experts``, ...) through ``getattr`` with the
neutral default, so the estimate works whether or not a field exists in this version. Pure arithmetic: no torch.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

Backend = Literal["ddp", "fsdp2", "megatron_fsdp"]


def cfg_get(obj: Any, name: str, default: Any) -> Any:
    """``obj.name``, or ``default`` when the field does not exist (in this version) or is None."""
    value = getattr(obj, name, None)
    return default if value is None else value


@dataclass(frozen=True)
class Layout:
    """Sizes of the parallel dimensions and the batch shape of one rank."""

    world_size: int
    tp: int
    """Tensor-parallel size."""
    pp: int
    """Pipeline-parallel size."""
    vp: int
    """Virtual pipeline stages per PP rank (1 without interleaving)."""
    cp: int
    """Context-parallel size."""
    ep: int
    """Expert-parallel size."""
    etp: int
    """Expert tensor-parallel size (Megatron's expert_tensor_parallel_size; default: tp)."""
    dp: int
    """Data-parallel size: world / (tp × pp × cp)."""
    backend: Backend
    """The data-parallel backend ``dist`` selects."""
    micro_batch_size: int
    num_microbatches: int
    """Micro-batches per step on each data-parallel rank."""
    seq_length: int
    sequence_parallel: bool
    pipeline_schedule: str
    """``model.pipeline_schedule`` as the engine resolves it ("1F1B", "Interleaved1F1B", "InterleavedZeroBubble",
    "ZBVZeroBubble", "DualPipeV"), "none" without PP."""

    @property
    def shard_size(self) -> int:
        """Ranks dense state is sharded over by FSDP / the distributed optimizer (Megatron's dp × cp group)."""
        return self.dp * self.cp

    @property
    def expert_shard_size(self) -> int:
        """Ranks expert state is sharded over (Megatron's expert-data-parallel group: dp × cp × tp / (ep × etp))."""
        return max(1, self.dp * self.cp * self.tp // (self.ep * self.etp))

    @property
    def splits_tokens_over_tp(self) -> bool:
        """MoE parallel folding with ETP 1 (EP > 1, TP > 1): each TP rank routes its own 1/TP of the tokens
        (:func:`megatron_bridge.config.rules_moe.splits_tokens_over_tp` on a config)."""
        return self.ep > 1 and self.tp > 1 and self.etp == 1

    @property
    def tokens_per_microbatch(self) -> int:
        """Tokens of one micro-batch on one rank (the sequence is split over CP ranks)."""
        return self.micro_batch_size * self.seq_length // self.cp


def backend_of(cfg: "ConfigContainer") -> Backend:
    """The backend ``dist`` selects (as :func:`megatron_bridge.engines.ddp_wrap.select_backend_class`)."""
    if cfg.dist.use_megatron_fsdp:
        return "megatron_fsdp"
    if cfg.dist.use_torch_fsdp2:
        return "fsdp2"
    return "ddp"


def _schedule(model: Any, pp: int, vp: int) -> str:
    """The schedule the engine runs (:func:`megatron_bridge.config.model.resolve_schedule`)."""
    if pp <= 1:
        return "none"
    named = cfg_get(model, "pipeline_schedule", None)
    return str(named) if named else ("Interleaved1F1B" if vp > 1 else "1F1B")


def layout_of(cfg: "ConfigContainer", world_size: int) -> Layout:
    """The layout of ``cfg`` on ``world_size`` processes (fields missing in this version count as 1 / off)."""
    m = cfg.model
    tp = int(cfg_get(m, "tensor_model_parallel_size", 1))
    pp = int(cfg_get(m, "pipeline_model_parallel_size", 1))
    vp = int(cfg_get(m, "virtual_pipeline_model_parallel_size", 1))
    cp = int(cfg_get(m, "context_parallel_size", 1))
    ep = int(cfg_get(m, "expert_model_parallel_size", 1))
    etp = int(cfg_get(m, "expert_tensor_parallel_size", tp))
    dp = max(1, world_size // (tp * pp * cp))
    mbs = cfg.train.micro_batch_size
    n_micro = max(1, cfg.train.global_batch_size // (mbs * dp))
    return Layout(
        world_size=world_size, tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, etp=etp, dp=dp, backend=backend_of(cfg),
        micro_batch_size=mbs, num_microbatches=n_micro, seq_length=m.seq_length,
        sequence_parallel=bool(cfg_get(m, "sequence_parallel", False)) and tp > 1,
        pipeline_schedule=_schedule(m, pp, vp),
    )


@dataclass(frozen=True)
class RankStages:
    """What one pipeline rank holds (all of its model chunks)."""

    pp_rank: int
    layers: tuple[int, ...]
    """Global indices of its decoder layers."""
    chunks: int
    """Model chunks (virtual stages) on the rank."""
    first: bool
    """Holds the embedding (stage 0)."""
    last: bool
    """Holds the final norm, the output layer and the loss (the last stage; rank 0 under the V schedules)."""


def pipeline_ranks(cfg: "ConfigContainer", layout: Layout) -> list[RankStages]:
    """Every pipeline rank's layers and edges, split exactly as the engine splits them
    (:func:`megatron_bridge.config.pipeline_layout.build_stage_specs`: even, first/last-stage sizes, embedding and
    loss counted as layers, an explicit ``pipeline_model_parallel_layout``, loop or V placement); one rank holding
    everything without PP."""
    if layout.pp <= 1:
        return [RankStages(0, tuple(range(cfg.model.num_layers)), 1, True, True)]
    from megatron_bridge.config.pipeline_layout import build_stage_specs

    specs = build_stage_specs(cfg.model)
    ranks = []
    for rank in range(layout.pp):
        mine = [s for s in specs if s.rank == rank]
        ranks.append(RankStages(rank, tuple(i for s in mine for i in s.layers), len(mine),
                                any(s.is_first for s in mine), any(s.is_last for s in mine)))
    return ranks


def chunks_in_flight(layout: Layout, pp_rank: int) -> int:
    """Chunk-micro-batches whose activations are alive at once on ``pp_rank`` at its peak, for the schedule's
    action order in torch.distributed.pipelining (checked against torch's own orders in
    tests/unit_tests/perf/test_pipeline_in_flight.py). A micro-batch's activations of a chunk live from its forward to
    its backward (the weight pass of the zero-bubble schedules, which still needs the layer inputs).

    * 1F1B: ``min(m, PP − r)`` (Megatron's and torch's warm-up);
    * Interleaved1F1B: warm-up ``(VP − 1)·R + 2(PP − 1 − r)`` forwards, then one more before the first backward
      (``R`` = micro-batches per round, ``PP`` when ``m >= PP``; capped at ``m·VP``): Megatron's
      ``PP·(1 + (PP − 1)/(PP·VP))`` rank stacks on the first rank;
    * InterleavedZeroBubble: ``(VP − 1)·R + PP`` on every rank (``VP·PP`` when ``m >= PP``; weight passes wait);
    * ZBVZeroBubble: ``min(2·PP, m + 1 + r, 2m)``;
    * DualPipeV: ``min(2·PP + 1, 2m)``.
    """
    p, v, m, r = layout.pp, layout.vp, layout.num_microbatches, pp_rank
    schedule = layout.pipeline_schedule
    if p <= 1 or schedule == "none":
        return 1
    if schedule == "1F1B":
        return min(m, p - r)
    if schedule == "ZBVZeroBubble":
        return min(2 * p, m + 1 + r, 2 * m)
    if schedule == "DualPipeV":
        return min(2 * p + 1, 2 * m)
    per_round = m // max(1, m // p)  # micro-batches per round of the interleaved (loop) schedules
    if schedule == "InterleavedZeroBubble":
        return min((v - 1) * per_round + p, m * v)
    return min((v - 1) * per_round + 2 * (p - 1 - r) + 1, m * v)  # Interleaved1F1B
