"""The megatron-core engine's default forward step (``GPTModel``'s argument order, the same masked next-token loss),
and the pre-hook that lets a step written for the native model call ``GPTModel``."""

from collections.abc import Iterator
from functools import partial
from typing import Any

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


def accept_native_call(module: nn.Module, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """Forward pre-hook (``with_kwargs``) on every ``GPTModel`` chunk: a custom forward step written for the native
    model, ``model(tokens, position_ids=..., labels=...)`` (e.g. one that calls
    :func:`megatron_bridge.training.gpt_step.forward_step`), runs on megatron-core's ``GPTModel``, whose
    ``position_ids`` and ``attention_mask`` are required: the missing ones are passed as None (the causal mask comes
    from the layer spec and RoPE positions from the sequence length, as in :func:`megatron_core_forward_step`).
    A call in ``GPTModel``'s own form (Megatron-Bridge's steps) passes unchanged."""
    if len(args) >= 3 or "attention_mask" in kwargs:
        return None
    kwargs = dict(kwargs)
    if len(args) < 2:
        kwargs.setdefault("position_ids", None)
    kwargs["attention_mask"] = None
    return args, kwargs
