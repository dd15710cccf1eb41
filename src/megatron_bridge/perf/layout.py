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
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of the dtypes configs name."""


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
    """"1f1b", "interleaved" (vp > 1) or "gpipe" (all forwards, then all backwards)."""

    @property
    def shard_size(self) -> int:
        """Ranks dense state is sharded over by FSDP / the distributed optimizer (Megatron's dp × cp group)."""
        return self.dp * self.cp

    @property
    def expert_shard_size(self) -> int:
        """Ranks expert state is sharded over (Megatron's expert-data-parallel group: dp × cp × tp / (ep × etp))."""
        return max(1, self.dp * self.cp * self.tp // (self.ep * self.etp))

    @property
    def tokens_per_microbatch(self) -> int:
        """Tokens of one micro-batch on one rank (the sequence is split over CP ranks)."""
        return self.micro_batch_size * self.seq_length // self.cp


def backend_of(cfg: "ConfigContainer") -> Backend:
    """The backend ``dist`` selects (as :func:`megatron_bridge.distributed.ddp_wrap.select_backend_class`)."""
    if cfg.dist.use_megatron_fsdp:
        return "megatron_fsdp"
    if cfg.dist.use_torch_fsdp2:
        return "fsdp2"
    return "ddp"


def _schedule(model: Any, pp: int, vp: int) -> str:
    named = str(cfg_get(model, "pipeline_schedule", "") or "").lower().replace("-", "").replace("_", "")
    if "gpipe" in named:
        return "gpipe"
    if vp > 1 or "interleaved" in named:
        return "interleaved"
    return "1f1b" if pp > 1 else "none"


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


def layers_per_stage(cfg: "ConfigContainer", layout: Layout) -> tuple[int, int]:
    """Decoder blocks on the first and on the last pipeline stage (all of them without PP).

    Honours Megatron's ``num_layers_in_first_pipeline_stage`` / ``num_layers_in_last_pipeline_stage`` when set;
    otherwise blocks are split evenly (the first stages take the remainder).
    """
    n, pp = cfg.model.num_layers, layout.pp
    if pp == 1:
        return n, n
    first = cfg_get(cfg.model, "num_layers_in_first_pipeline_stage", None)
    last = cfg_get(cfg.model, "num_layers_in_last_pipeline_stage", None)
    even = -(-n // pp)
    return int(first if first is not None else even), int(last if last is not None else n // pp)
