"""Per-step bookkeeping of MoE layers in the training loop: the auxiliary-loss gradient scale, the global expert
load (tokens per expert, per layer), the expert-bias update and the statistics that are logged.

One all-reduce per step (a ``[MoE layers of the whole model, experts + 2]`` float64 tensor over all ranks; each rank
fills the rows of the layers its pipeline stages hold) gives every rank the global token counts of every layer, so
the aux-loss-free expert bias moves identically everywhere (Megatron-core updates it in ``finalize_model_grads``
from counts reduced over the data-parallel ranks the same way).
"""

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from megatron_bridge.config.decoder_names import mtp_layer_indices
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.engines.base import MoEStepStats
from megatron_bridge.models.moe import MoELayer, moe_layers, set_aux_loss_scale, update_expert_bias


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer


def moe_token_copies(cfg: "ConfigContainer") -> int:
    """Ranks that route the same tokens: TP, or 1 when MoE parallel folding splits the TP group's tokens."""
    from megatron_bridge.config.rules_moe import splits_tokens_over_tp

    return 1 if splits_tokens_over_tp(cfg) else cfg.model.tensor_model_parallel_size


class MoETracker:
    """Finds the MoE layers of the (unwrapped) model chunks; :meth:`begin_step` / :meth:`end_step` around a step.

    Every rank builds the same ``[MoE layers of the whole model, experts + 2]`` table (row = global MoE layer, in
    layer order) and fills the rows of the layers it holds: pipeline stages hold different layers (some none at
    all), and after the all-reduce every rank, the last stage included, has every layer's statistics.
    """

    def __init__(self, layers: list[tuple[int, MoELayer]], device: torch.device, model_copies: int,
                 layer_ids: list[int] | None = None, num_experts: int | None = None, cp_size: int = 1) -> None:
        self.layers = layers
        self.device = device
        self.model_copies = model_copies
        """Ranks that route the same tokens (TP, or 1 under MoE parallel folding): global counts are divided by it."""
        self.layer_ids = sorted(layer_ids) if layer_ids is not None else sorted(idx for idx, _ in layers)
        """Global indices of every MoE layer of the model (on any pipeline stage)."""
        self.num_experts = num_experts or max((layer.router.num_experts for _, layer in layers), default=0)
        self.cp_size = cp_size
        """Context-parallel size: each CP rank's aux loss is its part of the sequence's loss (gradient scale x CP,
        as the backends average gradients over data-parallel x context-parallel ranks)."""
        missing = {idx for idx, _ in layers} - set(self.layer_ids)
        if missing:
            raise ValueError(f"MoE layers {sorted(missing)} are not in the model's MoE layers {self.layer_ids}")
        self.last = MoEStepStats()

    @classmethod
    def for_chunks(cls, chunks: list[nn.Module], device: torch.device, model_copies: int,
                   config: ModelConfig | None = None) -> "MoETracker | None":
        """A tracker over every MoE layer of ``chunks`` (this rank's stages), or None for a dense model. With
        ``config`` the table covers every MoE layer of the model, so a stage without MoE layers takes part too."""
        layers = [item for chunk in chunks for item in moe_layers(chunk)]
        if config is None:
            return cls(layers, device, model_copies) if layers else None
        if not config.is_moe:
            return None
        pattern = config.moe_layer_pattern()
        ids = [i for i, moe in enumerate(pattern) if moe]
        if pattern[-1]:  # multi-token prediction depths are built like the last layer (models/mtp.py)
            ids += mtp_layer_indices(config)
        return cls(layers, device, model_copies, ids, config.num_moe_experts, config.context_parallel_size)

    def begin_step(self, num_microbatches: int, loss_scale: float = 1.0) -> None:
        """Aux-loss gradients are scaled by ``loss_scale × CP / num_microbatches`` (the mean over micro-batches; the
        backends average over data-parallel × context-parallel ranks, and the CP ranks' parts add up)."""
        self.num_microbatches = num_microbatches
        set_aux_loss_scale(loss_scale * self.cp_size / num_microbatches)

    @torch.no_grad()
    def end_step(self, num_microbatches: int | None = None) -> MoEStepStats:
        """Reduce the step's counts and losses over all ranks, update expert biases, reset the accumulators.

        Only the last ``num_microbatches`` forward records of each router count (default: the number given to
        :meth:`begin_step`, else all): a pipeline schedule's first step runs one extra metadata forward first."""
        last = num_microbatches if num_microbatches is not None else getattr(self, "num_microbatches", None)
        row_of = {idx: i for i, idx in enumerate(self.layer_ids)}
        e = self.num_experts
        table = torch.zeros(len(self.layer_ids), e + 2, dtype=torch.float64)
        for idx, layer in self.layers:
            load, aux_sum, aux_count = layer.router.step_records(last)
            row = table[row_of[idx]]
            row[: load.numel()] += load
            row[-2] += aux_sum
            row[-1] += aux_count
        table = table.to(self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(table)
        table = table.cpu()
        stats = MoEStepStats()
        for idx, row in zip(self.layer_ids, table, strict=True):
            counts = row[:e] / self.model_copies
            stats.tokens_per_expert[idx] = counts.tolist()
            aux_sum, aux_n = float(row[-2]), float(row[-1])
            if aux_n > 0:
                stats.layer_aux_loss[idx] = aux_sum / aux_n
        for idx, layer in self.layers:
            update_expert_bias(layer.router, table[row_of[idx], : layer.router.num_experts] / self.model_copies)
            layer.router.reset_step_stats()
        if stats.layer_aux_loss:
            stats.aux_loss = sum(stats.layer_aux_loss.values())
        self.last = stats
        return stats
