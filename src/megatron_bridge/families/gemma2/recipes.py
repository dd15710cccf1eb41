"""Gemma 2 recipes. ``gemma2_2b`` is Megatron-Bridge's ``gemma2_2b_pretrain_2gpu_h100_bf16_config``
(``recipes/gemma/h100/gemma2.py``, read from the stored Megatron-Bridge source): the model of ``google/gemma-2-2b``'s
config.json (26 layers, hidden 2304, 8 heads over 4 KV groups of width 256, FFN 9216, vocabulary 256000, a
4096-token window on every other layer, RoPE base 10000, soft-capping 50 (attention) and 30 (final),
``query_pre_attn_scalar`` 256) on 2 GPUs at TP2, sequences of 4096, ``_pretrain_common``'s training values with
``grad_reduce_in_fp32=False`` (its DDP setting). ``tiny_gemma2`` is the CPU-sized model."""

from typing import Any

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.recipes.base import RecipeInfo, apply_common_overrides, pretrain_common
from megatron_bridge.recipes.tiny import tiny_llama_pretrain_config


def gemma2_model(num_layers: int, hidden: int, ffn: int, heads: int, kv_groups: int, *, window: int = 4096,
                 seq_length: int = 4096, vocab_size: int = 256_000, head_dim: int = 256,
                 query_pre_attn_scalar: int = 256, attn_softcap: float = 50.0, final_softcap: float = 30.0,
                 **extra: Any) -> ModelConfig:
    """A Gemma 2 decoder as transformers' ``Gemma2Config`` and Megatron-Bridge's ``Gemma2ModelProvider`` set it:
    zero-centred RMSNorm 1e-6 with post-norms, no q/k norm, GeGLU (tanh), the embedding scaled by √hidden and tied to
    the output, the even layers (the first one) a ``window``-token window (``window_size = (window - 1, 0)``) and the
    odd ones full, one RoPE base 10000, the softmax scale ``query_pre_attn_scalar ** -0.5``, the attention scores
    and the final logits soft-capped."""
    return ModelConfig(family="gemma2", num_layers=num_layers, hidden_size=hidden, ffn_hidden_size=ffn,
                       num_attention_heads=heads, num_query_groups=kv_groups, kv_channels=head_dim,
                       vocab_size=vocab_size, seq_length=seq_length, max_position_embeddings=8192,
                       normalization="RMSNorm", layernorm_epsilon=1e-6, layernorm_zero_centered_gamma=True,
                       post_norms=True, activation="geglu", scale_embeddings_by_sqrt_hidden=True,
                       share_embeddings_and_output_weights=True, softmax_scale=query_pre_attn_scalar ** -0.5,
                       window_size=(window - 1, 0), window_attn_skip_freq=2, rotary_base=10_000.0,
                       attn_logit_softcapping=attn_softcap, final_logit_softcapping=final_softcap, **extra)


def gemma2_2b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Gemma 2 2B (26 layers, hidden 2304, FFN 9216, 8 heads, 4 KV groups, window 4096, vocab 256000, sequences of
    4096) on 2 GPUs, TP2 PP1 CP1, with ``_pretrain_common``'s training values (300,000 steps of 32 samples,
    micro-batch 2, 500 warmup steps, evaluation every 500) and gradients reduced in bf16 as Megatron-Bridge's recipe."""
    from megatron_bridge.config.mixed_precision import bf16_mixed

    cfg = pretrain_common(gemma2_model(26, 2304, 9216, 8, 4, tensor_model_parallel_size=2, sequence_parallel=False))
    cfg.train.train_iters, cfg.train.global_batch_size, cfg.train.micro_batch_size = 300_000, 32, 2
    cfg.scheduler.lr_warmup_iters = 500
    cfg.validation.eval_interval, cfg.validation.eval_iters = 500, 32
    precision = bf16_mixed()
    precision.grad_reduce_in_fp32 = False
    cfg.mixed_precision, cfg.ddp.grad_reduce_in_fp32 = precision, False
    cfg.ddp.average_in_collective = False
    return apply_common_overrides(cfg, **overrides)


def tiny_gemma2_pretrain_config(**overrides: Any) -> ConfigContainer:
    """The tiny Llama's training (seq 128, byte vocabulary, fp32) on a tiny Gemma 2: 4 layers (window, full, window,
    full; a 32-token window, so every sequence is longer than it), hidden 128, 4 heads of width 32 over 2 KV groups,
    FFN 352, softmax scale from query_pre_attn_scalar 24, soft-capping 2 (attention) and 3 (final), weights drawn
    with std 0.1: the caps bend the scores and logits of the freshly initialized model (dropping the attention cap
    changes the first steps' losses by 5e-4 to 7e-3 relative, 50× the layout tests' tolerance and more)."""
    cfg = tiny_llama_pretrain_config()
    cfg.model = gemma2_model(4, 128, 352, 4, 2, window=32, seq_length=128, vocab_size=cfg.model.vocab_size,
                             head_dim=32, query_pre_attn_scalar=24, attn_softcap=2.0, final_softcap=3.0,
                             init_method_std=0.1)
    return apply_common_overrides(cfg, **overrides)


RECIPES = {
    "gemma2_2b": RecipeInfo(gemma2_2b_pretrain_config, 2),
    "tiny_gemma2": RecipeInfo(tiny_gemma2_pretrain_config, 2),
}
"""The family's recipes (short name → function and the world size its layout is meant for)."""
