"""The megatron-core engine's default forward step: ``GPTModel``'s argument order, the same masked next-token loss."""

from collections.abc import Iterator
from functools import partial

import torch
from torch import nn

from megatron_bridge.models.loss import Batch, LossFunc, get_batch, masked_next_token_loss, module_device


def megatron_core_forward_step(data_iterator: Iterator[Batch], model: nn.Module) -> tuple[torch.Tensor, LossFunc]:
    """:func:`~megatron_bridge.models.loss.forward_step` for megatron-core's ``GPTModel``
    (``model.engine="megatron_core"``): its forward takes
    ``(input_ids, position_ids, attention_mask)``; the causal mask comes from the layer spec (no mask tensor), and
    with ``labels`` it returns the per-token losses (vocab-parallel cross entropy under TP)."""
    device = module_device(model)
    batch = get_batch(data_iterator, device)
    output = model(batch["tokens"], batch.get("position_ids"), None, labels=batch["labels"])
    return output, partial(masked_next_token_loss, batch["loss_mask"])
