"""The default GPT forward step: masked next-token loss (:mod:`megatron_bridge.models.loss`).

A forward step has Megatron's shape: ``forward_step(data_iterator, model)`` (or ``forward_step(state,
data_iterator, model)``) returns ``(output_tensor, loss_func)``, and ``loss_func(output_tensor)`` returns
``(loss_sum, num_tokens, {"lm loss": ...})``. The loop sums ``loss_sum`` and ``num_tokens`` over micro-batches and
data-parallel ranks, so the reported loss and the gradients are token-weighted over the whole global batch.
"""

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
from torch import nn

from megatron_bridge.models.loss import Batch, LossFunc, get_batch, masked_next_token_loss, module_device


__all__ = ["Batch", "LossFunc", "call_forward_step", "forward_step", "get_batch", "masked_next_token_loss",
           "megatron_core_forward_step", "module_device"]


def forward_step(data_iterator: Iterator[Batch], model: nn.Module) -> tuple[torch.Tensor, LossFunc]:
    """Run the model on the next micro-batch; return per-token losses and the masked loss function."""
    device = module_device(model)
    batch = get_batch(data_iterator, device)
    output = model(batch["tokens"], position_ids=batch.get("position_ids"), labels=batch["labels"])
    return output, partial(masked_next_token_loss, batch["loss_mask"])


def megatron_core_forward_step(data_iterator: Iterator[Batch], model: nn.Module) -> tuple[torch.Tensor, LossFunc]:
    """:func:`forward_step` for megatron-core's ``GPTModel`` (``model.engine="megatron_core"``): its forward takes
    ``(input_ids, position_ids, attention_mask)``; the causal mask comes from the layer spec (no mask tensor), and
    with ``labels`` it returns the per-token losses (vocab-parallel cross entropy under TP)."""
    device = module_device(model)
    batch = get_batch(data_iterator, device)
    output = model(batch["tokens"], batch.get("position_ids"), None, labels=batch["labels"])
    return output, partial(masked_next_token_loss, batch["loss_mask"])


def call_forward_step(step: Callable[..., Any], state: Any, data_iterator: Iterator[Batch], model: nn.Module) -> Any:
    """Call a 2-argument ``(data_iterator, model)`` or 3-argument ``(state, data_iterator, model)`` forward step."""
    import inspect

    n_params = len(inspect.signature(step).parameters)
    if n_params >= 3:
        return step(state, data_iterator, model)
    return step(data_iterator, model)
