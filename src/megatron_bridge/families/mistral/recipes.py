"""Mistral recipes. Megatron-Bridge ships no Mistral pretraining recipe (only its bridge), so ``mistral_7b`` takes
Megatron-Bridge's common pretraining values (``pretrain_common``, as the Llama 3 8B recipe) with Mistral 7B v0.1's
shape, laid out for 2 GPUs with context parallelism as ``llama3_8b``; ``tiny_mistral`` is the CPU-sized model."""

from typing import Any

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.recipes.base import RecipeInfo, apply_common_overrides, pretrain_common
from megatron_bridge.recipes.tiny import tiny_llama_pretrain_config


def mistral_model(num_layers: int, hidden: int, ffn: int, heads: int, **extra: Any) -> ModelConfig:
    """A Mistral decoder: GQA with 8 KV heads of width 128, RoPE base 10000, vocab 32000, SwiGLU, RMSNorm 1e-5,
    a 4096-token sliding window in every layer, sequences of 4096 (positions up to 32768)."""
    return ModelConfig(family="mistral", num_layers=num_layers, hidden_size=hidden, ffn_hidden_size=ffn,
                       num_attention_heads=heads, num_query_groups=8, kv_channels=128, vocab_size=32000,
                       seq_length=4096, max_position_embeddings=32768, rotary_base=10000.0, normalization="RMSNorm",
                       activation="swiglu", layernorm_epsilon=1e-5, window_size=(4095, 0), **extra)


def mistral_7b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Mistral 7B v0.1 (32 layers, hidden 4096, FFN 14336, 32 heads, 8 KV groups, window 4096); TP1 PP1 CP2 on 2
    GPUs (``context_parallel_size=1`` for plain data parallelism)."""
    cfg = pretrain_common(mistral_model(32, 4096, 14336, 32, context_parallel_size=2))
    return apply_common_overrides(cfg, **overrides)


def tiny_mistral_pretrain_config(**overrides: Any) -> ConfigContainer:
    """The tiny Llama's model and training (4 layers, hidden 128, seq 128) with a 32-token sliding window: every
    sequence is longer than the window."""
    cfg = tiny_llama_pretrain_config()
    cfg.model.family, cfg.model.window_size = "mistral", (31, 0)
    return apply_common_overrides(cfg, **overrides)


RECIPES = {
    "mistral_7b": RecipeInfo(mistral_7b_pretrain_config, 2),
    "tiny_mistral": RecipeInfo(tiny_mistral_pretrain_config, 2),
}
"""The family's recipes (short name → function and the world size its layout is meant for)."""
