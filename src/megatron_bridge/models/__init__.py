"""The Llama-family decoder ("local" engine), the provider that builds model chunks, and FLOP/parameter counts."""

from megatron_bridge.models.flops import num_floating_point_operations, num_parameters
from megatron_bridge.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaMLP, LlamaModel
from megatron_bridge.models.provider import build_model_chunks, materialize_meta_model
from megatron_bridge.models.validation import check_parallel_layout, check_transformer_impl, validate_model_config


__all__ = [
    "LlamaAttention",
    "LlamaDecoderLayer",
    "LlamaMLP",
    "LlamaModel",
    "build_model_chunks",
    "check_parallel_layout",
    "check_transformer_impl",
    "materialize_meta_model",
    "num_floating_point_operations",
    "num_parameters",
    "validate_model_config",
]
