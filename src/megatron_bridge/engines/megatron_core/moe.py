"""Per-step bookkeeping of megatron-core's MoE layers in the training loop (the megatron-core engine's counterpart of
:class:`megatron_bridge.engines.native.moe_stats.MoETracker`).

* **Aux-loss gradient scale.** megatron-core's ``MoEAuxLossAutoScaler`` sends its losses' gradients times a global
  scale; its pipeline schedules set it to ``loss scale × CP / micro-batches`` in every forward step, and so does
  :meth:`MegatronCoreMoETracker.begin_step` for the loop's own micro-batch accumulation (PP = 1), as the native
  tracker does for the native router.
* **Expert bias.** megatron-core updates it itself in ``finalize_model_grads`` (the backend's ``finish_grad_sync``)
  from token counts reduced over its TP × DP × CP group.
* **Logged losses.** The routers record their auxiliary losses per layer in megatron-core's metrics tracker; its own
  reduction averages with ``ReduceOp.AVG``, which gloo does not have, so :meth:`MegatronCoreMoETracker.end_step`
  sums the step's records (each times its coefficient: megatron-core records them divided by it) over all ranks and
  divides by the copies (the same statistic as the native tracker's ``moe/load_balancing_loss``, without the
  per-expert token counts), then clears the tracker.
"""

from typing import Any

import torch
import torch.distributed as dist

from megatron_bridge.engines.base import MoEStepStats


class MegatronCoreMoETracker:
    """:meth:`begin_step` / :meth:`end_step` around a step of a megatron-core MoE model (module docstring)."""

    def __init__(self, model: Any, device: torch.device, world_size: int) -> None:
        self.device = device
        self.num_layers = model.num_layers
        self.cp_size = model.context_parallel_size
        self.copies = max(1, world_size // (model.pipeline_model_parallel_size * model.context_parallel_size))
        """Ranks that record a layer's whole loss once per micro-batch: TP × DP (CP ranks record parts of it)."""
        self.coefficients = {"z_loss": model.moe_z_loss_coeff or 0.0}
        """megatron-core records each loss divided by its coefficient; the native tracker logs them multiplied (what
        the gradient sees): the load-balancing kinds take ``moe_aux_loss_coeff``."""
        self.aux_coeff = model.moe_aux_loss_coeff
        self.num_microbatches = 1
        self.last = MoEStepStats()

    def begin_step(self, num_microbatches: int, loss_scale: float = 1.0) -> None:
        """Aux-loss gradients scaled by ``loss_scale × CP / num_microbatches`` (megatron-core's schedules' value)."""
        from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

        self.num_microbatches = num_microbatches
        MoEAuxLossAutoScaler.set_loss_scale(  # shape [1], as its schedules set it (set_loss_scale copies into it)
            torch.full((1,), loss_scale * self.cp_size / num_microbatches, device=self.device))

    @torch.no_grad()
    def end_step(self, num_microbatches: int | None = None) -> MoEStepStats:
        """The step's mean auxiliary loss per MoE layer (every recorded kind times its coefficient, summed), over all
        ranks; clears the tracker."""
        from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

        tracker = get_moe_metrics_tracker()
        table = torch.zeros(self.num_layers, dtype=torch.float64)
        for name, entry in tracker.metrics.items():
            coeff = self.coefficients.get(name, self.aux_coeff)
            table[: entry.values.numel()] += entry.values.detach().double().cpu() * coeff
        table = table.to(self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(table)
        table = table.cpu() / (self.copies * (num_microbatches or self.num_microbatches))
        tracker.clear()
        stats = MoEStepStats(layer_aux_loss={i: float(v) for i, v in enumerate(table) if v != 0})
        if stats.layer_aux_loss:
            stats.aux_loss = sum(stats.layer_aux_loss.values())
        self.last = stats
        return stats
