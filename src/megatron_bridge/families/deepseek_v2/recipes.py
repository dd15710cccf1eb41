"""DeepSeek-V2 family recipes: ``deepseek_v2_lite`` (DeepSeek-V2-Lite's Hugging Face architecture on 8 GPUs) and
``tiny_deepseek_v2``, the CPU-sized model.

The repository's Megatron-Bridge reference tables (``tests/unit_tests/config/test_recipes_megatron_bridge.py``) hold
no values of Megatron-Bridge's ``deepseek_v2_lite_pretrain_8gpu_h100_bf16_config``, so ``deepseek_v2_lite`` is not
that recipe: the model is ``deepseek-ai/DeepSeek-V2-Lite``'s config.json, the training this library's
``pretrain_common`` defaults, with the 64 experts split over the 8 GPUs (EP=8); docs/models/deepseek-v3.md."""

from typing import Any

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.recipes.base import RecipeInfo, apply_common_overrides, pretrain_common
from megatron_bridge.recipes.tiny import tiny_moe_pretrain_config


def deepseek_v2_lite_model(**layout: Any) -> ModelConfig:
    """DeepSeek-V2-Lite (Hugging Face ``deepseek-ai/DeepSeek-V2-Lite``): 27 layers (1 dense of width 10944), hidden
    2048, 16 heads with MLA without a query latent (kv latent 512, heads 128 + 64 RoPE, values 128), YaRN ×40 from
    4096 (mscale 0.707 on both), 64 experts of width 1408 top-6 by softmax (greedy, not renormalized, routed scaling
    1.0), two shared experts, no expert bias, sequence aux loss 1e-3, vocabulary 102400."""
    return ModelConfig(
        family="deepseek_v2", num_layers=27, hidden_size=2048, ffn_hidden_size=10944, num_attention_heads=16,
        vocab_size=102400, seq_length=4096, max_position_embeddings=163840, layernorm_epsilon=1e-6,
        multi_latent_attention=True, q_lora_rank=None, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64,
        v_head_dim=128, rotary_base=10000.0, position_embedding_type="yarn", yarn_rotary_scaling_factor=40.0,
        yarn_original_max_position_embeddings=4096, yarn_mscale=0.707, yarn_mscale_all_dim=0.707,
        **deepseek_v2_moe(64, 1408, 6, 2 * 1408, 1, 27, 1.0, 1e-3), **layout)


def deepseek_v2_moe(experts: int, width: int, topk: int, shared: int, dense: int, layers: int, scale: float,
                    aux: float) -> dict[str, Any]:
    """DeepSeek-V2's experts: softmax over every expert, greedy top-k of the probabilities as they are
    (``norm_topk_prob`` false), no expert bias, sequence aux loss, grouped GEMM."""
    return {"num_moe_experts": experts, "moe_ffn_hidden_size": width, "moe_router_topk": topk,
            "moe_shared_expert_intermediate_size": shared, "moe_layer_freq": [0] * dense + [1] * (layers - dense),
            "moe_router_score_function": "softmax", "moe_router_pre_softmax": True,
            "moe_router_enable_expert_bias": False, "moe_router_topk_scaling_factor": scale,
            "moe_router_num_groups": None, "moe_router_group_topk": None,
            "moe_router_load_balancing_type": "seq_aux_loss", "moe_aux_loss_coeff": aux, "moe_grouped_gemm": True}


def deepseek_v2_lite_pretrain_config(**overrides: Any) -> ConfigContainer:
    """DeepSeek-V2-Lite pretraining on 8 GPUs: EP=8, ``pretrain_common``'s training values (module docstring)."""
    cfg = pretrain_common(deepseek_v2_lite_model(expert_model_parallel_size=8))
    return apply_common_overrides(cfg, **overrides)


def tiny_deepseek_v2_pretrain_config(**overrides: Any) -> ConfigContainer:
    """The tiny MoE's data, optimizer and schedule with DeepSeek-V2-Lite's architecture at CPU size: 4 layers (the
    first dense), hidden 128, 4 MLA heads without a query latent (kv latent 32, heads 32 + 16 RoPE, values 32), YaRN
    ×4 from 32 tokens, 8 experts of width 96 top-2 by softmax (greedy, not renormalized), two shared experts, sequence
    aux loss 1e-2; expert parallelism over 2 ranks (``expert_model_parallel_size=1`` for one process)."""
    cfg = tiny_moe_pretrain_config()
    m = cfg.model
    m.family, m.num_query_groups, m.layernorm_epsilon = "deepseek_v2", None, 1e-6
    m.multi_latent_attention, m.q_lora_rank, m.kv_lora_rank = True, None, 32
    m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim = 32, 16, 32
    m.position_embedding_type, m.yarn_rotary_scaling_factor, m.yarn_original_max_position_embeddings = "yarn", 4.0, 32
    m.yarn_mscale, m.yarn_mscale_all_dim = 0.707, 0.707
    for name, value in deepseek_v2_moe(8, 96, 2, 2 * 96, 1, m.num_layers, 1.0, 1e-2).items():
        setattr(m, name, value)
    m.expert_model_parallel_size = 2
    return apply_common_overrides(cfg, **overrides)


RECIPES = {
    "deepseek_v2_lite": RecipeInfo(deepseek_v2_lite_pretrain_config, 8),
    "tiny_deepseek_v2": RecipeInfo(tiny_deepseek_v2_pretrain_config, 2),
}
"""The family's recipes (short name → function and the world size its layout is meant for)."""
