"""The default GPT forward step under Megatron-Bridge's import path (it lives in :mod:`megatron_bridge.models.loss`;
megatron-core's in :mod:`megatron_bridge.engines.megatron_core.forward_step`), and calling a forward step.

A forward step has Megatron's shape: ``forward_step(data_iterator, model)`` (or ``forward_step(state,
data_iterator, model)``) returns ``(output_tensor, loss_func)``, and ``loss_func(output_tensor)`` returns
``(loss_sum, num_tokens, {"lm loss": ...})``. The loop sums ``loss_sum`` and ``num_tokens`` over micro-batches and
data-parallel ranks, so the reported loss and the gradients are token-weighted over the whole global batch.
"""

from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from megatron_bridge.models.loss import Batch, LossFunc, forward_step, get_batch, masked_next_token_loss, module_device


__all__ = ["Batch", "LossFunc", "call_forward_step", "forward_step", "get_batch", "masked_next_token_loss",
           "module_device"]


def call_forward_step(step: Callable[..., Any], state: Any, data_iterator: Iterator[Batch], model: nn.Module) -> Any:
    """Call a 2-argument ``(data_iterator, model)`` or 3-argument ``(state, data_iterator, model)`` forward step."""
    import inspect

    n_params = len(inspect.signature(step).parameters)
    if n_params >= 3:
        return step(state, data_iterator, model)
    return step(data_iterator, model)
