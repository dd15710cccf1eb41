"""Our model objects on the Bridge's side: build one for loading, fill it tensor by tensor, read it back out."""

from collections.abc import Iterator, Mapping, Sequence

import torch
from torch import nn

from megatron_bridge.config.decoder_names import ROTARY
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError


def unwrap(module: nn.Module) -> nn.Module:
    """The model inside DDP-style wrappers (``.module``)."""
    while hasattr(module, "module") and isinstance(module.module, nn.Module):
        module = module.module
    return module


def build_model(config: ModelConfig, device: torch.device | str, *, init: bool) -> nn.Module:
    """A :class:`LlamaModel` on ``device``: randomly initialized with ``init``, else uninitialized except for its
    RoPE buffer (every parameter is then overwritten by :func:`load_weights_into`)."""
    from megatron_bridge.models.llama import LlamaModel

    model = LlamaModel(config, device="meta")
    model.to_empty(device=device)
    if init:
        model.init_weights()
    else:
        getattr(model, ROTARY).reset_parameters()
    return model


def _chunks(model: list[nn.Module] | nn.Module) -> list[nn.Module]:
    return list(model) if isinstance(model, (list, tuple)) else [model]


def _state(chunk: nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return {k: v for k, v in get_model_state_dict(chunk).items() if isinstance(v, torch.Tensor)}


def load_weights_into(model: list[nn.Module] | nn.Module, weights: Mapping[str, torch.Tensor],
                      kept: Sequence[str] = ()) -> None:
    """Copy every tensor of ``weights`` (full tensors, our names) into the model's parameters — plain or DTensor
    shards — reading one tensor at a time; BridgeError when names differ. Parameters named in ``kept`` may be
    missing from ``weights`` (they keep their values)."""
    from megatron_bridge.checkpoint.load import copy_full_into

    targets: dict[str, torch.Tensor] = {}
    for chunk in _chunks(model):
        targets.update(_state(chunk))
    missing = sorted(set(targets) - set(weights) - set(kept))
    unexpected = sorted(set(weights) - set(targets))
    if missing or unexpected:
        raise BridgeError(f"weights do not fit the model: missing {missing[:6]}, unexpected {unexpected[:6]}")
    for name in weights:
        tensor = weights[name]
        if tuple(tensor.shape) != tuple(targets[name].shape):
            raise BridgeError(f"{name!r}: weights {list(tensor.shape)} vs model {list(targets[name].shape)}")
        copy_full_into(targets[name], tensor)
        del tensor


def iter_model_weights(model: list[nn.Module] | nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(our name, full CPU tensor)`` for every parameter, one at a time; DTensors are gathered with
    ``full_tensor()`` (a collective: every rank must iterate)."""
    for chunk in _chunks(model):
        for name, tensor in _state(chunk).items():
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            yield name, tensor.detach().to("cpu")
