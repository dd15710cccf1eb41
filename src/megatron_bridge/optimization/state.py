"""The modelopt state of a quantized model in our checkpoints: ``modelopt_state.pt`` in every ``iter_*`` folder.

The model weights in a checkpoint stay those of the plain model (so pretrained loads, conversion and the Bridge see
the usual keys); the quantizers' structure (``modelopt.torch.opt.modelopt_state``) and their calibrated buffers
(``*_quantizer._amax``, ``_pre_quant_scale``...) go to one rank-0 file, loaded with ``weights_only=True``. Every rank
holds the same quantizer buffers (calibration runs on the same samples everywhere and the buffers are not trained),
so one copy restores any world size.
"""

import io
from pathlib import Path
from typing import Any

import torch
from torch import nn

from megatron_bridge.errors import CheckpointError
from megatron_bridge.models.quantizer_keys import is_quantizer_key, without_quantizer_keys


__all__ = ["MODELOPT_STATE_FILENAME", "is_quantized", "is_quantizer_key", "modelopt_state_bytes", "quantizer_state",
           "read_modelopt_state", "restore_modelopt_state", "without_quantizer_keys"]

MODELOPT_STATE_FILENAME = "modelopt_state.pt"
"""File of a checkpoint folder holding {"modelopt_state": ..., "quantizer_state": {key: tensor}}."""


def is_quantized(module: nn.Module) -> bool:
    """Whether modelopt quantizers were inserted into ``module``."""
    return any(is_quantizer_key(k + ".x") for k, _ in module.named_modules() if k)


def quantizer_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The quantizers' buffers of an unwrapped module, as CPU copies."""
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items() if is_quantizer_key(k)}


def modelopt_state_bytes(module: nn.Module) -> bytes:
    """Serialized ``{"modelopt_state", "quantizer_state"}`` of an unwrapped quantized module."""
    import modelopt.torch.opt as mto

    buffer = io.BytesIO()
    torch.save({"modelopt_state": mto.modelopt_state(module), "quantizer_state": quantizer_state(module)}, buffer)
    return buffer.getvalue()


def read_modelopt_state(folder: str | Path) -> dict[str, Any] | None:
    """The modelopt state of a checkpoint folder (None when it has none), read with ``weights_only=True``."""
    from megatron_bridge.checkpoint.reader import load_torch_file

    path = Path(folder) / MODELOPT_STATE_FILENAME
    if not path.is_file():
        return None
    content = load_torch_file(path, "modelopt state")
    if not isinstance(content, dict) or not {"modelopt_state", "quantizer_state"} <= set(content):
        raise CheckpointError(f"{str(path)!r} holds no 'modelopt_state' and 'quantizer_state'")
    return content


def restore_modelopt_state(module: nn.Module, content: dict[str, Any], where: str) -> nn.Module:
    """Re-create the quantizers of ``content`` in a plain ``module`` and load their buffers; returns the module."""
    import modelopt.torch.opt as mto

    module = mto.restore_from_modelopt_state(module, content["modelopt_state"])
    result = module.load_state_dict(content["quantizer_state"], strict=False)
    missing = [k for k in result.missing_keys if is_quantizer_key(k)]
    if result.unexpected_keys or missing:
        raise CheckpointError(
            f"the modelopt state of {where} does not fit the model: unexpected {result.unexpected_keys[:8]}, "
            f"missing {missing[:8]}"
        )
    return module
