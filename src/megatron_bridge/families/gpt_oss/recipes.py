"""GPT-OSS recipes: Megatron-Bridge's ``gpt_oss_20b_pretrain_config`` (alias
``gpt_oss_20b_pretrain_16gpu_h100_bf16_config``: TP2 PP4 EP4 on 16 GPUs) and ``gpt_oss_120b_pretrain_config``
(``gpt_oss_120b_pretrain_64gpu_h100_bf16_config``: TP2 PP4 EP16 on 64), ``recipes/gpt_oss/gpt_oss.py``, with the
models' Hugging Face shapes (``openai/gpt-oss-20b``, ``openai/gpt-oss-120b``); EP is folded over the TP ranks
(expert_tensor_parallel_size 1) as there. ``tiny_gpt_oss`` is the CPU-sized model.

Differences kept on purpose: the window is Hugging Face's 128 tokens including the current one,
``window_size = (127, 0)`` (Megatron-Bridge's provider writes ``(128, 0)``, the off-by-one its PR 2656 fixed in the
bridges); what the local engine does not build (transformer-engine kernels, the DeepEP dispatcher, manual GC) is left
out."""

from typing import Any

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.recipes.base import RecipeInfo, apply_common_overrides, pretrain_common
from megatron_bridge.recipes.tiny import tiny_moe_pretrain_config


GPT_OSS_FIXED: dict[str, Any] = {
    "activation": "quick_geglu", "glu_linear_offset": 1.0, "activation_func_clamp_value": 7.0,
    "softmax_type": "learnable", "add_qkv_bias": True, "add_bias_linear": True, "window_attn_skip_freq": 2,
    "moe_router_score_function": "softmax", "moe_router_pre_softmax": False, "moe_grouped_gemm": True,
    "moe_token_dispatcher_type": "alltoall", "expert_tensor_parallel_size": 1, "position_embedding_type": "yarn",
    "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0, "yarn_correction_range_round_to_int": False,
}
"""What every GPT-OSS model sets: the clamped quick-GeGLU experts with the +1 offset, sinks, biases, window and full
layers alternating (the even layers windowed), softmax top-k over the k, YaRN without truncation."""


def gpt_oss_model(num_layers: int, experts: int, **layout: Any) -> ModelConfig:
    """A GPT-OSS decoder as Hugging Face's config and Megatron-Bridge's ``GPTOSSProvider`` set it: hidden 2880, 64
    heads of width 64 over 8 KV groups, experts of width 2880 top-4, vocabulary 201088, RMSNorm 1e-5, a 128-token
    window on every other layer, YaRN ×32 from 4096 with base 150000, sequences of 4096 (Megatron-Bridge's recipes),
    no load-balancing loss (its provider's ``moe_router_load_balancing_type="none"``)."""
    return ModelConfig(family="gpt_oss", num_layers=num_layers, hidden_size=2880, ffn_hidden_size=2880,
                       num_attention_heads=64, num_query_groups=8, kv_channels=64, vocab_size=201088,
                       seq_length=4096, max_position_embeddings=131072, layernorm_epsilon=1e-5,
                       rotary_base=150000.0, yarn_rotary_scaling_factor=32.0,
                       yarn_original_max_position_embeddings=4096, window_size=(127, 0), num_moe_experts=experts,
                       moe_ffn_hidden_size=2880, moe_router_topk=4, moe_router_load_balancing_type="none",
                       **GPT_OSS_FIXED, **layout)


def _gpt_oss_training(cfg: ConfigContainer) -> ConfigContainer:
    """Megatron-Bridge's GPT-OSS training values (changed from ``_pretrain_common``): 1M steps of 512 samples,
    micro-batch 1, 2000 warmup steps, evaluation every 2000 steps."""
    cfg.train.train_iters, cfg.train.global_batch_size, cfg.train.micro_batch_size = 1_000_000, 512, 1
    cfg.validation.eval_interval = 2000
    cfg.scheduler.lr_warmup_iters = 2000
    return cfg


def gpt_oss_20b_pretrain_16gpu_h100_bf16_config(**overrides: Any) -> ConfigContainer:
    """GPT-OSS 20B (24 layers, 32 experts; 21B parameters, 3.6B active) on 16 H100s: TP2 PP4 EP4 with sequence
    parallelism (data-parallel size 2; EP folded over TP)."""
    model = gpt_oss_model(24, 32, tensor_model_parallel_size=2, pipeline_model_parallel_size=4,
                          expert_model_parallel_size=4, sequence_parallel=True)
    return apply_common_overrides(_gpt_oss_training(pretrain_common(model)), **overrides)


def gpt_oss_120b_pretrain_64gpu_h100_bf16_config(**overrides: Any) -> ConfigContainer:
    """GPT-OSS 120B (36 layers, 128 experts; 117B parameters, 5.1B active) on 64 H100s: TP2 PP4 EP16 with sequence
    parallelism (data-parallel size 8; EP folded over TP)."""
    model = gpt_oss_model(36, 128, tensor_model_parallel_size=2, pipeline_model_parallel_size=4,
                          expert_model_parallel_size=16, sequence_parallel=True)
    return apply_common_overrides(_gpt_oss_training(pretrain_common(model)), **overrides)


gpt_oss_20b_pretrain_config = gpt_oss_20b_pretrain_16gpu_h100_bf16_config
gpt_oss_120b_pretrain_config = gpt_oss_120b_pretrain_64gpu_h100_bf16_config


def tiny_gpt_oss_pretrain_config(**overrides: Any) -> ConfigContainer:
    """The tiny MoE (4 layers, hidden 128, 8 experts of width 96, top-2, switch aux loss 1e-2; expert parallelism
    over 2 ranks, experts whole on every TP rank) in GPT-OSS's form: sinks, biases, a 32-token window on layers 0 and
    2 (sequences of 128 are longer), YaRN ×4 from 32, the clamped quick-GeGLU experts with biases; the expert width is
    ffn_hidden_size, as GPT-OSS's intermediate_size is both."""
    cfg = tiny_moe_pretrain_config()
    m = cfg.model
    m.family, m.ffn_hidden_size = "gpt_oss", m.expert_ffn_hidden_size
    for name, value in GPT_OSS_FIXED.items():
        setattr(m, name, value)
    m.window_size, m.yarn_rotary_scaling_factor, m.yarn_original_max_position_embeddings = (31, 0), 4.0, 32
    return apply_common_overrides(cfg, **overrides)


RECIPES = {
    "gpt_oss_20b": RecipeInfo(gpt_oss_20b_pretrain_16gpu_h100_bf16_config, 16),
    "gpt_oss_120b": RecipeInfo(gpt_oss_120b_pretrain_64gpu_h100_bf16_config, 64),
    "tiny_gpt_oss": RecipeInfo(tiny_gpt_oss_pretrain_config, 2),
}
"""The family's recipes (short name → function and the world size its layout is meant for: Megatron-Bridge's, EP
folded over TP as there)."""
