"""Which state-dict keys belong to nvidia-modelopt quantizers inserted into a model (``*_quantizer._amax``, ...).

Model checkpoints hold the plain model's weights; the quantizers' buffers are saved apart
(:mod:`megatron_bridge.optimization.state`), so the data-parallel backends leave these keys out of the model state.
"""

from typing import Any


def is_quantizer_key(key: str) -> bool:
    """A state-dict key that belongs to a modelopt quantizer (``...q_proj.weight_quantizer._amax``)."""
    return any(part.endswith("_quantizer") for part in key.split(".")[:-1])


def without_quantizer_keys(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` without the quantizer entries (the model weights only)."""
    return {k: v for k, v in state.items() if not is_quantizer_key(k)}
