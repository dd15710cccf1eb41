"""Mixtral recipes. Megatron-Bridge ships no Mixtral pretraining recipe (only its bridge), so these take
Megatron-Bridge's common pretraining values (``pretrain_common``) with Mixtral 8x7B's and 8x22B's shapes; expert
parallelism spans the data-parallel ranks (EP folded over TP is the MoE-folding work). ``tiny_mixtral`` is the
CPU-sized model."""

from typing import Any

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.recipes.base import RecipeInfo, apply_common_overrides, pretrain_common
from megatron_bridge.recipes.tiny import tiny_moe_pretrain_config


def mixtral_model(num_layers: int, hidden: int, ffn: int, heads: int, vocab: int, max_positions: int,
                  **layout: Any) -> ModelConfig:
    """A Mixtral decoder: GQA with 8 KV heads of width 128, RoPE base 1e6, RMSNorm 1e-5, full attention, 8 SwiGLU
    experts of width ``ffn`` in every layer with softmax top-2 routing (renormalized), switch aux loss 1e-3 (HF's
    router_aux_loss_coef), sequences of 4096."""
    return ModelConfig(family="mixtral", num_layers=num_layers, hidden_size=hidden, ffn_hidden_size=ffn,
                       num_attention_heads=heads, num_query_groups=8, kv_channels=128, vocab_size=vocab,
                       seq_length=4096, max_position_embeddings=max_positions, rotary_base=1_000_000.0,
                       normalization="RMSNorm", activation="swiglu", layernorm_epsilon=1e-5, num_moe_experts=8,
                       moe_ffn_hidden_size=ffn, moe_router_topk=2, moe_router_score_function="softmax",
                       moe_router_pre_softmax=False, moe_aux_loss_coeff=1e-3, moe_grouped_gemm=True,
                       moe_token_dispatcher_type="alltoall", expert_tensor_parallel_size=1, **layout)


def mixtral_8x7b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Mixtral 8x7B (32 layers, hidden 4096, 8 experts of width 14336, 32 heads; 46.7B parameters, 12.9B active):
    PP4 EP8 on 32 GPUs (data-parallel size 8)."""
    model = mixtral_model(32, 4096, 14336, 32, 32000, 32768, pipeline_model_parallel_size=4,
                          expert_model_parallel_size=8)
    return apply_common_overrides(pretrain_common(model), **overrides)


def mixtral_8x22b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Mixtral 8x22B (56 layers, hidden 6144, 8 experts of width 16384, 48 heads; 141B parameters, 39B active):
    TP2 PP8 EP8 with sequence parallelism on 128 GPUs (data-parallel size 8)."""
    model = mixtral_model(56, 6144, 16384, 48, 32768, 65536, tensor_model_parallel_size=2,
                          pipeline_model_parallel_size=8, expert_model_parallel_size=8, sequence_parallel=True)
    return apply_common_overrides(pretrain_common(model), **overrides)


def tiny_mixtral_pretrain_config(**overrides: Any) -> ConfigContainer:
    """The tiny MoE (4 layers, hidden 128, 8 experts of width 96, top-2; expert parallelism over 2 ranks) in
    Mixtral's form: the expert width equals ffn_hidden_size, as Mixtral's intermediate_size is both; experts whole on
    every tensor-parallel rank (expert_tensor_parallel_size=1, as the full-size recipes)."""
    cfg = tiny_moe_pretrain_config()
    m = cfg.model
    m.family, m.ffn_hidden_size, m.expert_tensor_parallel_size = "mixtral", m.expert_ffn_hidden_size, 1
    return apply_common_overrides(cfg, **overrides)


RECIPES = {
    "mixtral_8x7b": RecipeInfo(mixtral_8x7b_pretrain_config, 32),
    "mixtral_8x22b": RecipeInfo(mixtral_8x22b_pretrain_config, 128),
    "tiny_mixtral": RecipeInfo(tiny_mixtral_pretrain_config, 2),
}
"""The family's recipes (short name → function and the world size its layout is meant for)."""
