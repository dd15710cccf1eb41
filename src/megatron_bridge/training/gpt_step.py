"""The default GPT forward step under Megatron-Bridge's import path (it lives in :mod:`megatron_bridge.models.loss`;
megatron-core's in :mod:`megatron_bridge.engines.megatron_core.forward_step`), and calling a forward step.

A forward step has Megatron's shape: ``forward_step(data_iterator, model)`` (or any of Megatron-Bridge's other
forms, :mod:`megatron_bridge.engines.forward_step_forms`) returns ``(output_tensor, loss_func)``, and
``loss_func(output_tensor)`` returns ``(loss_sum, num_tokens, {"lm loss": ...})``. The loop sums ``loss_sum`` and
``num_tokens`` over micro-batches and data-parallel ranks, so the reported loss and the gradients are token-weighted
over the whole global batch.
"""

from megatron_bridge.engines.forward_step_forms import call_forward_step
from megatron_bridge.models.loss import Batch, LossFunc, forward_step, get_batch, masked_next_token_loss, module_device


__all__ = ["Batch", "LossFunc", "call_forward_step", "forward_step", "get_batch", "masked_next_token_loss",
           "module_device"]
