"""What an engine builds for a run, and the pipeline runner both engines' schedules implement."""

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.distributed.base import DataParallelBackend
    from megatron_bridge.models.loss import Batch

ForwardStep = Callable[[Iterator["Batch"], nn.Module], Any]
"""A forward step bound to its state: ``step(data_iterator, model) -> (output_tensor, loss_func)``."""


class PipelineRunner(Protocol):
    """One training or evaluation step of pipeline parallelism over a step's micro-batches."""

    def run(self, batches: list["Batch"], *, scale: float | None, train: bool) -> tuple[float, float]:
        """Forward (and with ``train`` backward) over ``batches``; this rank's (loss sum, token count): the last
        stage's, zeros on the other stages."""
        ...


@dataclass
class MoEStepStats:
    """What the MoE layers did in one optimizer step (global over all ranks)."""

    aux_loss: float | None = None
    """Sum over MoE layers of each layer's mean auxiliary loss (load balancing + z-loss); None when both are off."""
    layer_aux_loss: dict[int, float] = field(default_factory=dict)
    """Mean auxiliary loss of each MoE layer, by layer index."""
    tokens_per_expert: dict[int, list[float]] = field(default_factory=dict)
    """Token-expert assignments each expert received in the step, by layer index (global batch)."""


@dataclass(frozen=True)
class CheckpointSide:
    """The checkpoint side of an engine: which folders its runs write and read as they are, and what a checkpoint of
    the other engine is converted from. The checkpoint package (:mod:`megatron_bridge.checkpoint.manager`,
    :mod:`megatron_bridge.checkpoint.foreign`) picks its writer and readers from it, never from the engine's name."""

    megatron_core_format: bool
    """True: megatron-core ``dist_checkpointing`` folders (torch_dist, or fsdp_dtensor under Megatron FSDP) with
    Megatron-Bridge's ``train_state.pt``; False: this library's DCP folders."""
    other_engine: str
    """``model.engine`` of the other engine, whose checkpoints this one loads through a converted copy."""
    convert_target: str
    """``scripts/checkpoint/convert.py --to`` value that writes this engine's checkpoints."""


NATIVE_CHECKPOINTS = CheckpointSide(megatron_core_format=False, other_engine="megatron_core",
                                    convert_target="megatron")
MEGATRON_CORE_CHECKPOINTS = CheckpointSide(megatron_core_format=True, other_engine="native",
                                           convert_target="megatron_core")


class Engine(Protocol):
    """The engine-specific parts of a run (``model.engine``); :func:`megatron_bridge.engines.factory.get_engine`
    picks one from the config."""

    name: str
    """``model.engine``'s value."""
    checkpoint: CheckpointSide
    """What its runs' checkpoints are (:class:`CheckpointSide`)."""

    def build_model_chunks(self, cfg: "ConfigContainer", device: torch.device, pp_rank: int) -> list[nn.Module]:
        """This rank's model chunks (one per virtual pipeline stage)."""
        ...

    def backend_class(self, cfg: "ConfigContainer") -> type["DataParallelBackend"]:
        """The data-parallel backend ``cfg.dist`` selects for this engine's chunks."""
        ...

    def build_optimizer(self, cfg: "ConfigContainer", chunks: list[nn.Module], device: torch.device) -> Any:
        """The optimizer over the wrapped chunks' parameters."""
        ...

    def grad_scaler(self, cfg: "ConfigContainer", device: torch.device, optimizer: Any) -> Any:
        """fp16's loss scaler (``scale``/``update``, as ``torch.amp.GradScaler``), None without fp16."""
        ...

    def pipeline_runner(self, cfg: "ConfigContainer", backend: "DataParallelBackend", device: torch.device,
                        n_microbatches: int, step: ForwardStep) -> PipelineRunner | None:
        """The pipeline schedule under PP > 1 (None otherwise); ``step`` is the run's forward step, bound to the
        training state."""
        ...

    def default_forward_step(self) -> Callable[..., Any]:
        """The forward step ``pretrain`` runs when given the library's default."""
        ...

    def check_forward_step(self, cfg: "ConfigContainer", forward_step: Callable[..., Any]) -> None:
        """Refuse a forward step this engine cannot run with ``cfg``."""
        ...

    def moe_tracker(self, cfg: "ConfigContainer", chunks: list[nn.Module], device: torch.device,
                    world_size: int) -> Any:
        """The per-step bookkeeping of the MoE layers of the (unwrapped) ``chunks`` (``begin_step``, ``end_step``,
        ``last``: :class:`megatron_bridge.engines.native.moe_stats.MoETracker`'s interface), None for a dense model."""
        ...

    def mtp_tracker(self, cfg: "ConfigContainer", chunks: list[nn.Module], device: torch.device) -> Any:
        """The per-step bookkeeping of multi-token prediction (``begin_step``, ``end_step`` → ``{"mtp_1 loss": ...}``:
        :class:`megatron_bridge.engines.native.mtp_stats.MTPTracker`'s interface), None without MTP."""
        ...

    def destroy_groups(self) -> None:
        """Release the process-group state this engine set up (before the default group goes)."""
        ...
