"""One training or evaluation step through a ``torch.distributed.pipelining`` schedule.

:class:`PipelineRunner` wraps this rank's model chunks (the data-parallel backend's wrapped stage modules) in
``PipelineStage`` objects over the ``"pp"`` group and builds the schedule ``model.pipeline_schedule`` names. A step
feeds the concatenated micro-batches of the step (the schedule splits them back into the same micro-batches):
token ids to the first stage, ``position_ids`` to every stage, and labels with the loss mask as the target of the
last stage, whose loss function computes exactly what ``gpt_step.forward_step`` computes at PP=1 (float32 per-token
cross-entropy, masked sum). The loss it back-propagates is scaled as the loop scales it (``dp_size / global
tokens``, ``scale_grads=False``), so gradients equal a PP=1 run's. The last stage records each micro-batch's loss
sum and token count; other stages report zeros, and the loop's all-reduce gives every rank the global loss.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import get_schedule_class
from torch.nn import functional as F

from megatron_bridge.config.model import SINGLE_STAGE_SCHEDULES, V_SCHEDULES, resolve_schedule
from megatron_bridge.config.pipeline_layout import build_stage_specs, stages_of_rank
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.models.loss import masked_next_token_loss
from megatron_bridge.utils.logging import get_logger, log_rank_0


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.distributed.base import DataParallelBackend

logger = get_logger(__name__)

Batch = dict[str, torch.Tensor]


@dataclass
class _StepLosses:
    """What the last stage's loss function saw during one schedule step."""

    scale: float | None
    """Multiplier of the loss sum that is back-propagated; None: mean over tokens and micro-batches."""
    n_micro: int
    loss_sums: list[torch.Tensor] = field(default_factory=list)
    token_counts: list[torch.Tensor] = field(default_factory=list)


class PipelineRunner:
    """Runs the pipeline schedule of ``cfg.model`` over the backend's wrapped stage modules.

    Args:
        cfg: the run config (``model.pipeline_*`` fields).
        backend: the data-parallel backend whose ``chunks`` are this rank's stages and whose ``pp_group`` is set.
        device: the device this rank computes on.
        n_microbatches: micro-batches per step (``cfg.num_microbatches``).
    """

    def __init__(self, cfg: "ConfigContainer", backend: "DataParallelBackend", device: torch.device,
                 n_microbatches: int) -> None:
        if backend.pp_group is None:
            raise ConfigValidationError(
                f"the {backend.name} backend did not set up a pipeline group: pipeline parallelism runs with DDP or "
                "FSDP2", ("model.pipeline_model_parallel_size",))
        self.backend = backend
        self.device = device
        self.schedule_name = resolve_schedule(cfg.model)
        pp_rank = dist.get_rank(backend.pp_group)
        self.specs = stages_of_rank(cfg.model, pp_rank)
        self.stages = [PipelineStage(chunk, spec.index, spec.num_stages, device, group=backend.pp_group)
                       for chunk, spec in zip(backend.chunks, self.specs, strict=True)]
        self.holds_last_stage = any(spec.is_last for spec in self.specs)
        self._losses = _StepLosses(None, n_microbatches)
        schedule_cls = get_schedule_class(self.schedule_name)
        stages: Any = self.stages[0] if self.schedule_name in SINGLE_STAGE_SCHEDULES else self.stages
        self.schedule = schedule_cls(stages, n_microbatches=n_microbatches, loss_fn=self._loss, scale_grads=False)
        self.eval_schedule = self.schedule
        if self.schedule_name in V_SCHEDULES:  # their eval() runs the backward actions' bookkeeping and fails
            self.eval_schedule = self._forward_only_schedule(cfg, n_microbatches)
        log_rank_0(logger, "pipeline: %s over %d stages (%d per rank), %d micro-batches per step",
                   self.schedule_name, self.specs[0].num_stages, len(self.specs), n_microbatches)

    def _forward_only_schedule(self, cfg: "ConfigContainer", n_microbatches: int) -> Any:
        """A forward-only schedule over the same stages and placement: each micro-batch runs through the stages in
        order (GPipe-like; evaluation needs no overlap). Uses torch's schedule runtime with a compute-only action
        list, from which torch adds the sends and receives."""
        from torch.distributed.pipelining.schedules import (
            _Action,
            _add_send_recv,
            _add_unshard_reshard,
            _ComputationType,
            _PipelineScheduleRuntime,
        )

        # Stage objects of its own: a stage's communication buffers are set up for one schedule.
        stages = [PipelineStage(s.submod, s.stage_index, s.num_stages, self.device, group=self.backend.pp_group)
                  for s in self.stages]
        runtime = _PipelineScheduleRuntime(stages, n_microbatches=n_microbatches, loss_fn=self._loss,
                                           scale_grads=False)
        specs = build_stage_specs(cfg.model)
        placement = {spec.index: spec.rank for spec in specs}
        runtime.stage_index_to_group_rank = placement  # the V placement (the runtime defaults to "loop")
        for stage in stages:
            stage.stage_index_to_group_rank = placement
        order: dict[int, list[Any]] = {r: [] for r in range(cfg.model.pipeline_model_parallel_size)}
        for mb in range(n_microbatches):
            for spec in specs:
                order[spec.rank].append(_Action(spec.index, _ComputationType.FORWARD, mb))
        with_fsdp = {rank: _add_unshard_reshard(actions) for rank, actions in order.items()}  # FSDP/replicate
        runtime.pipeline_order_with_comms = _add_send_recv(with_fsdp, stage_to_rank=placement.__getitem__,
                                                           num_stages=len(specs))
        return runtime

    def _loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The last stage's loss of one micro-batch: the masked token-loss sum, scaled as the loop scales it."""
        labels, loss_mask = target[..., 0].long(), target[..., 1].to(torch.float32)
        b, s = labels.shape
        per_token = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none").view(b, s)
        loss_sum, tokens, _ = masked_next_token_loss(loss_mask, per_token)
        record = self._losses
        record.loss_sums.append(loss_sum.detach())
        record.token_counts.append(tokens.detach())
        if record.scale is None:
            return loss_sum / tokens.clamp(min=1) / record.n_micro
        return loss_sum * record.scale

    def _inputs(self, batches: list[Batch]) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        def cat(key: str) -> torch.Tensor:
            return torch.cat([b[key] for b in batches]).to(self.device, non_blocking=True)

        kwargs = {"position_ids": cat("position_ids")} if "position_ids" in batches[0] else {}
        labels = cat("labels")
        mask = cat("loss_mask") if "loss_mask" in batches[0] else torch.ones_like(labels, dtype=torch.float32)
        # One target tensor (the schedule splits it per micro-batch); float64 holds every token id exactly.
        target = torch.stack([labels.to(torch.float64), mask.to(torch.float64)], dim=-1)
        return cat("tokens"), kwargs, target

    def run(self, batches: list[Batch], *, scale: float | None, train: bool) -> tuple[float, float]:
        """One step (``train``: forward and backward; else forward only) over ``batches``, the step's micro-batches.

        Returns this rank's (loss sum, token count): the last stage's, zeros on the other stages.
        """
        self._losses = _StepLosses(scale, len(batches))
        tokens, kwargs, target = self._inputs(batches)
        with self.backend.forward_context():
            if train:
                self.schedule.step(tokens, target=target, return_outputs=False, **kwargs)
            else:
                self.eval_schedule.eval(tokens, target=target, return_outputs=False, **kwargs)
        record = self._losses
        if not record.loss_sums:
            return 0.0, 0.0
        # The first step's metadata inference calls the loss function once more, on placeholder activations, before
        # the real micro-batches: only the last n_micro calls are the step's.
        sums, counts = record.loss_sums[-len(batches):], record.token_counts[-len(batches):]
        return float(torch.stack(sums).double().sum()), float(torch.stack(counts).sum())
