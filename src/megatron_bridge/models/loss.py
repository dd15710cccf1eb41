"""The masked next-token loss of a GPT micro-batch, and reading that micro-batch.

``loss_func(output_tensor)`` returns ``(loss_sum, num_tokens, {"lm loss": ...})``: the loop sums ``loss_sum`` and
``num_tokens`` over micro-batches and data-parallel ranks, so the reported loss and the gradients are token-weighted
over the whole global batch. :func:`forward_step` is the native engine's default forward step (Megatron-Bridge's
import path ``megatron_bridge.training.gpt_step.forward_step`` names it too); the pipeline's last stage, distillation
and megatron-core's forward step compute the loss the same way.
"""

from collections.abc import Callable, Iterator
from functools import partial

import torch
from torch import nn


Batch = dict[str, torch.Tensor]
LossFunc = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]]


def get_batch(data_iterator: Iterator[Batch], device: torch.device) -> Batch:
    """Next micro-batch moved to ``device`` (tokens, labels, loss_mask, position_ids)."""
    batch = next(data_iterator)
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def masked_next_token_loss(
    loss_mask: torch.Tensor, output_tensor: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Sum of per-token losses where ``loss_mask`` is 1, the number of such tokens, and the report for logging."""
    mask = loss_mask.to(torch.float32).reshape(-1)
    loss_sum = torch.sum(output_tensor.to(torch.float32).reshape(-1) * mask)
    num_tokens = mask.sum()
    return loss_sum, num_tokens, {"lm loss": torch.stack([loss_sum.detach(), num_tokens.detach()])}


def module_device(model: nn.Module) -> torch.device:
    """The device of the model's first materialized parameter (CPU when all are on the meta device)."""
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")


def forward_step(data_iterator: Iterator[Batch], model: nn.Module) -> tuple[torch.Tensor, LossFunc]:
    """Run the model on the next micro-batch; return per-token losses and the masked loss function."""
    device = module_device(model)
    batch = get_batch(data_iterator, device)
    extra = {"loss_mask": batch["loss_mask"]} if has_mtp(model) else {}  # MTP's loss reads the mask (models/mtp.py)
    output = model(batch["tokens"], position_ids=batch.get("position_ids"), labels=batch["labels"], **extra)
    return output, partial(masked_next_token_loss, batch["loss_mask"])


def has_mtp(model: nn.Module) -> bool:
    """Whether ``model`` (or the model a DDP / Megatron FSDP wrapper holds as ``module``) has multi-token prediction
    depths (``LlamaModel.mtp``)."""
    while getattr(model, "mtp", None) is None and isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return getattr(model, "mtp", None) is not None
