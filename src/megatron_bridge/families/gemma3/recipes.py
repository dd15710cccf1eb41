"""Gemma 3 recipes. ``gemma3_1b`` is Megatron-Bridge's ``gemma3_1b_pretrain_config`` (its alias of
``gemma3_1b_pretrain_1gpu_h100_bf16_config``, ``recipes/gemma/h100/gemma3.py``): ``Gemma3ModelProvider`` with 26
layers, hidden 1152, 4 heads, 1 KV group of width 256, FFN 6912, a 512-token window, RoPE bases 10000 (local) and
1e6 (global), sequences of 32768, and the Llama 3 training values on 1 GPU. ``tiny_gemma3`` is the CPU-sized model."""

from typing import Any

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.recipes.base import RecipeInfo, apply_common_overrides, pretrain_common
from megatron_bridge.recipes.tiny import tiny_llama_pretrain_config


def gemma3_model(num_layers: int, hidden: int, ffn: int, heads: int, kv_groups: int, *, window: int = 512,
                 seq_length: int = 32768, vocab_size: int = 262_144, head_dim: int = 256,
                 query_pre_attn_scalar: int = 256, **extra: Any) -> ModelConfig:
    """A Gemma 3 text decoder as Megatron-Bridge's ``Gemma3ModelProvider`` sets it: head width 256 (softmax scale
    ``query_pre_attn_scalar ** -0.5`` = 1/16), zero-centred RMSNorm 1e-6 with post-norms, q/k norm, GeGLU (tanh),
    the embedding scaled by √hidden and tied to the output, every 6th layer full attention and the others a
    ``window``-token window (HF's ``sliding_window``: ``window_size = (window - 1, 0)``) with RoPE base 10000, the
    full layers base 1e6."""
    return ModelConfig(family="gemma3", num_layers=num_layers, hidden_size=hidden, ffn_hidden_size=ffn,
                       num_attention_heads=heads, num_query_groups=kv_groups, kv_channels=head_dim,
                       vocab_size=vocab_size,
                       seq_length=seq_length, max_position_embeddings=seq_length, normalization="RMSNorm",
                       layernorm_epsilon=1e-6, layernorm_zero_centered_gamma=True, post_norms=True,
                       qk_layernorm=True, activation="geglu", scale_embeddings_by_sqrt_hidden=True,
                       share_embeddings_and_output_weights=True, softmax_scale=query_pre_attn_scalar ** -0.5,
                       window_size=(window - 1, 0), window_attn_skip_freq=6, rotary_base=1_000_000.0,
                       rotary_base_local=10_000.0, **extra)


def gemma3_1b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Gemma 3 1B (26 layers, hidden 1152, FFN 6912, 4 heads, 1 KV group, window 512, vocab 262144, sequences of
    32768) on 1 GPU, TP1 PP1 CP1, with Megatron-Bridge's training values (1,168,251 steps of 512 samples, micro-batch
    1, 2000 warmup steps, evaluation every 2000)."""
    cfg = pretrain_common(gemma3_model(26, 1152, 6912, 4, 1))
    return apply_common_overrides(cfg, **overrides)


def tiny_gemma3_pretrain_config(**overrides: Any) -> ConfigContainer:
    """The tiny Llama's training (seq 128, byte vocabulary, fp32) on a tiny Gemma 3: 6 layers (5 window : 1 full,
    a 32-token window, so every sequence is longer than it), hidden 128, 4 heads of width 32 over 2 KV groups,
    FFN 352, softmax scale from query_pre_attn_scalar 24 (not the head width, so the scale is exercised)."""
    cfg = tiny_llama_pretrain_config()
    cfg.model = gemma3_model(6, 128, 352, 4, 2, window=32, seq_length=128, vocab_size=cfg.model.vocab_size,
                             head_dim=32, query_pre_attn_scalar=24)
    return apply_common_overrides(cfg, **overrides)


RECIPES = {
    "gemma3_1b": RecipeInfo(gemma3_1b_pretrain_config, 1),
    "tiny_gemma3": RecipeInfo(tiny_gemma3_pretrain_config, 2),
}
"""The family's recipes (short name → function and the world size its layout is meant for)."""
