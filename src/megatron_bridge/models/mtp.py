"""Multi-token prediction (``model.mtp_num_layers``), as megatron-core's ``MultiTokenPredictionBlock`` defines it
(DeepSeek-V3's MTP modules).

Module and parameter names (depth ``k`` = 1, 2, ... has the layer index ``i = num_layers + k - 1``, the index Hugging
Face DeepSeek-V3 checkpoints give it)::

    mtp.layers.{i}.enorm               norm of the embedding of the tokens shifted by k
    mtp.layers.{i}.hnorm               norm of the previous depth's hidden states
    mtp.layers.{i}.eh_proj             [hidden, 2 * hidden] projection of cat(enorm, hnorm) (embedding first)
    mtp.layers.{i}.transformer_layer   one decoder layer built like the model's last one (MoE when that one is)
    mtp.layers.{i}.final_layernorm     norm before the output layer

Forward of depth k on the previous depth's hidden states ``h`` (for k = 1: the main decoder's output after its final
norm, as megatron-core's block receives it) and the input ids rolled left by k (zeros shifted in)::

    h_k = final_layernorm(transformer_layer(eh_proj(cat(enorm(embed(ids >> k)), hnorm(h_{k-1})))))
    logits_k = output_layer(h_k)          # the main model's embedding and output layer, shared

The RoPE positions are the main model's. Loss: the labels and the loss mask rolled left by k more (zeros shifted
in), ``L_k = sum(mask_k * CE(logits_k, labels_k)) / max(sum(mask_k), 1)``, and the model's MTP loss is
``mtp_loss_scaling_factor / D * sum_k L_k`` over the D depths. As in megatron-core it is not added to the returned
per-token loss: :class:`MTPLossScaler` attaches it to the hidden states that go into the output layer, so backward
adds its gradient times :func:`set_mtp_loss_scale`'s factor (the training loop sets ``loss_scale / micro-batches``,
megatron-core's ``MTPLossAutoScaler.set_loss_scale``): the gradient of the mean over micro-batches (and, through the
backends' gradient averaging, over data-parallel ranks) of each micro-batch's MTP loss. The main logits and the main
loss are those of the model without MTP. MTP runs in training mode with labels only.

Each training forward (not an activation-checkpointing recompute) records every depth's ``L_k``; the training loop
reads them (:mod:`megatron_bridge.engines.native.mtp_stats`) and logs ``mtp_{k} loss`` (megatron-core's tag).
"""

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from megatron_bridge.config import decoder_names as n
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.models.layers import build_norm


Rope = tuple[torch.Tensor, torch.Tensor]


class MTPLossScaler(torch.autograd.Function):
    """Identity on the hidden states whose backward also sends ``scale`` as the gradient of the MTP loss."""

    scale: ClassVar[float] = 1.0

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, output: torch.Tensor, mtp_loss: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(mtp_loss)
        return output

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_output: torch.Tensor) -> tuple[torch.Tensor, ...]:
        (mtp_loss,) = ctx.saved_tensors
        return grad_output, torch.full_like(mtp_loss, MTPLossScaler.scale)


def set_mtp_loss_scale(scale: float) -> None:
    """Factor applied to the gradient of the MTP loss (1.0 unless the training loop sets it)."""
    MTPLossScaler.scale = float(scale)


def roll_left(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor [b, s]`` shifted left by one along the sequence, a zero shifted in at the end (megatron-core's
    ``roll_tensor`` at CP=1)."""
    return torch.cat([tensor[:, 1:], torch.zeros_like(tensor[:, :1])], dim=1)


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


class MultiTokenPredictionLayer(nn.Module):
    """One depth (module docstring)."""

    def __init__(self, config: ModelConfig, decoder_layer: nn.Module, *, dtype: torch.dtype,
                 linear: Callable[..., nn.Linear]) -> None:
        super().__init__()
        h = config.hidden_size
        self.enorm = build_norm(config, h, device="meta", dtype=dtype)
        self.hnorm = build_norm(config, h, device="meta", dtype=dtype)
        self.eh_proj = linear(2 * h, h, False, dtype=dtype)
        self.transformer_layer = decoder_layer
        self.final_layernorm = build_norm(config, h, device="meta", dtype=dtype)

    def forward(self, hidden: torch.Tensor, embedded: torch.Tensor, rope: Rope, local_rope: Rope) -> torch.Tensor:
        """``hidden`` (the previous depth's output) and ``embedded`` (the shifted tokens' embedding), both
        ``[b, s, hidden]`` → this depth's normalized output ``[b, s, hidden]``."""
        x = self.eh_proj(torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1))
        layer = self.transformer_layer
        x = layer(x, *(local_rope if getattr(layer, "uses_local_rope", False) else rope))
        return self.final_layernorm(x)


class MultiTokenPrediction(nn.Module):
    """The depths of ``config.mtp_num_layers`` in a ``ModuleDict`` keyed by layer index (module docstring).

    Args:
        config: the model's config.
        make_layer: builds one decoder layer like the model's last one (the caller's class, so that this module does
            not import the model).
        dtype: parameter dtype.
        linear: the model's meta-device ``nn.Linear`` factory.
    """

    def __init__(self, config: ModelConfig, make_layer: Callable[[], nn.Module], *, dtype: torch.dtype,
                 linear: Callable[..., nn.Linear]) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleDict({
            str(i): MultiTokenPredictionLayer(config, make_layer(), dtype=dtype, linear=linear)
            for i in n.mtp_layer_indices(config)})
        self._records: list[list[float]] = []
        self.last_losses: list[torch.Tensor] = []
        """The depths' losses ``L_k`` of the last forward (float32 scalars, with their graph)."""

    def depth_losses(self, hidden: torch.Tensor, input_ids: torch.Tensor, labels: torch.Tensor,
                     loss_mask: torch.Tensor | None, ropes: tuple[Rope, Rope],
                     embed: Callable[[torch.Tensor], torch.Tensor],
                     output: Callable[[torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
        """Every depth's masked mean cross-entropy ``L_k`` (float32 scalars).

        Args:
            hidden: the main decoder's output after its final norm ``[b, s, hidden]``.
            input_ids, labels: ``[b, s]``; ``labels[t]`` is the token after ``input_ids[t]``.
            loss_mask: ``[b, s]`` (None: every token counts).
            ropes: the main model's RoPE ``(cos, sin)`` and the local-window layers' one.
            embed: the model's embedding (with its scaling); ``output``: its output layer (hidden → logits).
        """
        mask = torch.ones_like(labels, dtype=torch.float32) if loss_mask is None else loss_mask.to(torch.float32)
        losses = []
        for layer in self.layers.values():
            input_ids, labels, mask = roll_left(input_ids), roll_left(labels), roll_left(mask)
            hidden = layer(hidden, embed(input_ids), *ropes)
            logits = output(hidden)
            ce = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none")
            losses.append((ce * mask.flatten()).sum() / mask.sum().clamp(min=1.0))
        return losses

    def attach_loss(self, hidden: torch.Tensor, input_ids: torch.Tensor, labels: torch.Tensor,
                    loss_mask: torch.Tensor | None, ropes: tuple[Rope, Rope],
                    embed: Callable[[torch.Tensor], torch.Tensor],
                    output: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``hidden`` unchanged, with the MTP loss ``mtp_loss_scaling_factor / D * sum_k L_k`` attached for backward
        (:class:`MTPLossScaler`); records the depths' losses."""
        losses = self.depth_losses(hidden, input_ids, labels, loss_mask, ropes, embed, output)
        self.last_losses = losses
        if not _in_backward():  # not again when activation checkpointing recomputes
            self._records.append([float(loss.detach()) for loss in losses])
        total = torch.stack(losses).sum() * (self.config.mtp_loss_scaling_factor / len(losses))
        return MTPLossScaler.apply(hidden, total)

    def step_records(self, last: int | None = None) -> tuple[list[float], int]:
        """Per depth, the sum of the last ``last`` recorded losses (all when None), and how many were summed."""
        records = self._records if last is None else self._records[-last:] if last > 0 else []
        sums = [0.0] * len(self.layers)
        for record in records:
            sums = [a + b for a, b in zip(sums, record, strict=True)]
        return sums, len(records)

    def reset_step_stats(self) -> None:
        """Forget the step's records."""
        self._records = []


def mtp_modules(module: nn.Module) -> list[MultiTokenPrediction]:
    """Every :class:`MultiTokenPrediction` inside ``module``."""
    return [sub for sub in module.modules() if isinstance(sub, MultiTokenPrediction)]
