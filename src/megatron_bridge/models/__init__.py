"""The Llama-family decoder ("local" engine), the provider that builds model chunks, and FLOP/parameter counts.

The FLOP/parameter counts (:mod:`.flops`) are pure arithmetic and import eagerly; the torch-backed names load on
first use, so ``megatron_bridge.models.flops`` (and the dry-run estimate built on it) stays torch-free.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from megatron_bridge.models.flops import (
    ParameterBreakdown,
    num_floating_point_operations,
    num_parameters,
    parameter_breakdown,
)


if TYPE_CHECKING:
    from megatron_bridge.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaMLP, LlamaModel
    from megatron_bridge.models.provider import build_model_chunks, materialize_meta_model
    from megatron_bridge.models.validation import check_parallel_layout, check_transformer_impl, validate_model_config

_LAZY = {
    "LlamaAttention": "llama", "LlamaDecoderLayer": "llama", "LlamaMLP": "llama", "LlamaModel": "llama",
    "build_model_chunks": "provider", "materialize_meta_model": "provider",
    "check_parallel_layout": "validation", "check_transformer_impl": "validation",
    "validate_model_config": "validation",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f"megatron_bridge.models.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'megatron_bridge.models' has no attribute {name!r}")


__all__ = [
    "LlamaAttention",
    "LlamaDecoderLayer",
    "LlamaMLP",
    "LlamaModel",
    "ParameterBreakdown",
    "build_model_chunks",
    "check_parallel_layout",
    "check_transformer_impl",
    "materialize_meta_model",
    "num_floating_point_operations",
    "num_parameters",
    "parameter_breakdown",
    "validate_model_config",
]
