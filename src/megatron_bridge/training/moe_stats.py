"""Per-step bookkeeping of MoE layers in the training loop: the auxiliary-loss gradient scale, the global expert
load (tokens per expert, per layer), the expert-bias update and the statistics that are logged.

One all-reduce per step (a ``[layers, experts + 2]`` float64 tensor over all ranks) gives every rank the global
token counts, so the aux-loss-free expert bias moves identically everywhere (Megatron-core updates it in
``finalize_model_grads`` from counts reduced over the data-parallel ranks the same way).
"""

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from megatron_bridge.models.moe import MoELayer, moe_layers, set_aux_loss_scale, update_expert_bias


@dataclass
class MoEStepStats:
    """What the MoE layers did in one optimizer step (global over all ranks)."""

    aux_loss: float | None = None
    """Sum over MoE layers of each layer's mean auxiliary loss (load balancing + z-loss); None when both are off."""
    layer_aux_loss: dict[int, float] = field(default_factory=dict)
    """Mean auxiliary loss of each MoE layer, by layer index."""
    tokens_per_expert: dict[int, list[float]] = field(default_factory=dict)
    """Token-expert assignments each expert received in the step, by layer index (global batch)."""


class MoETracker:
    """Finds the MoE layers of the (unwrapped) model chunks; :meth:`begin_step` / :meth:`end_step` around a step."""

    def __init__(self, layers: list[tuple[int, MoELayer]], device: torch.device, model_copies: int) -> None:
        self.layers = layers
        self.device = device
        self.model_copies = model_copies
        """Ranks that see the same tokens (TP): global counts are divided by it."""
        self.last = MoEStepStats()

    @classmethod
    def for_chunks(cls, chunks: list[nn.Module], device: torch.device, model_copies: int) -> "MoETracker | None":
        """A tracker over every MoE layer of ``chunks``, or None for a dense model."""
        layers = [item for chunk in chunks for item in moe_layers(chunk)]
        return cls(layers, device, model_copies) if layers else None

    def begin_step(self, num_microbatches: int, loss_scale: float = 1.0) -> None:
        """Aux-loss gradients are scaled by ``loss_scale / num_microbatches`` (the mean over micro-batches; the
        backends average over data-parallel ranks)."""
        set_aux_loss_scale(loss_scale / num_microbatches)

    @torch.no_grad()
    def end_step(self) -> MoEStepStats:
        """Reduce the step's counts and losses over all ranks, update expert biases, reset the accumulators."""
        rows = []
        for _, layer in self.layers:
            r = layer.router
            extra = torch.tensor([r.aux_loss_sum, float(r.aux_loss_count)], dtype=torch.float64, device=self.device)
            rows.append(torch.cat([r.tokens_per_expert.to(self.device, torch.float64), extra]))
        table = _pad_stack(rows)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(table)
        stats = MoEStepStats()
        any_aux = False
        for row, (idx, layer) in zip(table, self.layers, strict=True):
            e = layer.router.num_experts
            counts = row[:e] / self.model_copies
            update_expert_bias(layer.router, counts)
            layer.router.reset_step_stats()
            stats.tokens_per_expert[idx] = counts.tolist()
            aux_sum, aux_n = float(row[-2]), float(row[-1])
            if aux_n > 0:
                any_aux = True
                stats.layer_aux_loss[idx] = aux_sum / aux_n
        if any_aux:
            stats.aux_loss = sum(stats.layer_aux_loss.values())
        self.last = stats
        return stats


def _pad_stack(rows: list[torch.Tensor]) -> torch.Tensor:
    """Stack rows of possibly different lengths (layers with different expert counts), counts left-aligned and the two
    loss entries kept last."""
    width = max(r.numel() for r in rows)
    out = torch.zeros(len(rows), width, dtype=torch.float64, device=rows[0].device)
    for i, r in enumerate(rows):
        out[i, : r.numel() - 2] = r[:-2]
        out[i, -2:] = r[-2:]
    return out
