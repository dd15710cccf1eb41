"""The masked next-token loss of a GPT micro-batch, and reading that micro-batch.

``loss_func(output_tensor)`` returns ``(loss_sum, num_tokens, {"lm loss": ...})``: the loop sums ``loss_sum`` and
``num_tokens`` over micro-batches and data-parallel ranks, so the reported loss and the gradients are token-weighted
over the whole global batch. The default forward steps (:mod:`megatron_bridge.training.gpt_step`), the pipeline's last
stage and distillation compute it the same way.
"""

from collections.abc import Callable, Iterator

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
