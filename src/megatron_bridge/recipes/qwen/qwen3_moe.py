"""Qwen3-MoE pretraining recipes: Qwen3-30B-A3B and Qwen3-235B-A22B (dimensions of the published models, the
``moe_*`` settings of Megatron-Bridge's Qwen3-MoE bridge, and its recipes' parallel layouts where this library can
express them)."""

from typing import Any

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.recipes.base import apply_common_overrides, convergence_cohort, pretrain_common


def qwen3_moe_model(num_layers: int, hidden: int, ffn: int, heads: int, moe_ffn: int, **layout: Any) -> ModelConfig:
    """A Qwen3-MoE decoder: every layer MoE with 128 routed SwiGLU experts, top-8 routing with the softmax over the
    selected logits (``norm_topk_prob``), switch aux loss 1e-3, no shared expert; head dim 128, 4 KV heads,
    QK-norm, RoPE base 1e6, vocab 151936, seq 4096 (positions up to 40960), untied output layer."""
    return ModelConfig(
        family="qwen3_moe", num_layers=num_layers, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads,
        num_query_groups=4, kv_channels=128, vocab_size=151936, seq_length=4096, max_position_embeddings=40960,
        rotary_base=1_000_000.0,
        normalization="RMSNorm", layernorm_epsilon=1e-6, activation="swiglu", qk_layernorm=True,
        share_embeddings_and_output_weights=False, num_moe_experts=128, moe_ffn_hidden_size=moe_ffn,
        moe_router_topk=8, moe_router_score_function="softmax", moe_router_pre_softmax=False,
        moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-3, moe_grouped_gemm=True,
        moe_token_dispatcher_type="alltoall", moe_permute_fusion=True, expert_tensor_parallel_size=1, **layout,
    )


def qwen3_30b_a3b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Qwen3-30B-A3B (48 layers, hidden 2048, 32 heads, 128 experts of width 768, top-8; 30.5B parameters, 3.3B
    active) as Megatron-Bridge's ``qwen3_30b_a3b_pretrain_config`` (its 16-GPU H100 recipe): TP1 PP1 CP1 EP16
    (experts 8 per rank), 16 GPUs, with its convergence values (100 steps of 1024 samples, 40 warmup steps,
    gradients reduced in bf16; :func:`~megatron_bridge.recipes.base.convergence_cohort`).

    Megatron-Bridge's 8-GPU variant (TP4 PP2 EP4 with sequence parallelism, EP folded over the TP ranks) is
    :func:`qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config`.
    """
    model = qwen3_moe_model(48, 2048, 6144, 32, 768, expert_model_parallel_size=16)
    return apply_common_overrides(convergence_cohort(_mb_training(pretrain_common(model))), **overrides)


def qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config(**overrides: Any) -> ConfigContainer:
    """Qwen3-30B-A3B as Megatron-Bridge's 8-GPU H100 recipe (``qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config``): TP4
    PP2 EP4 with sequence parallelism, bfloat16 activations between stages, full recompute (uniform, 1 layer), its
    ``_pretrain_common`` training values (300000 steps of 32 samples, micro-batch 2, 500 warmup steps). On 8 GPUs,
    as there: with ``expert_tensor_parallel_size=1`` EP folds over the TP ranks of a stage (MoE parallel folding,
    docs/training/moe.md), each TP rank routing its own sequence-parallel tokens."""
    model = qwen3_moe_model(48, 2048, 6144, 32, 768, tensor_model_parallel_size=4, pipeline_model_parallel_size=2,
                            expert_model_parallel_size=4, sequence_parallel=True, pipeline_dtype="bfloat16")
    model.recompute_granularity, model.recompute_method, model.recompute_num_layers = "full", "uniform", 1
    return apply_common_overrides(_mb_training(pretrain_common(model)), **overrides)


def qwen3_235b_a22b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Qwen3-235B-A22B (94 layers, hidden 4096, 64 heads, 128 experts of width 1536, top-8; 235B parameters, 22B
    active); Megatron-Bridge's pretraining layout (its 256-GPU H100 recipe): TP4 PP16 CP2 EP8 with sequence
    parallelism, the embedding and the loss each counted as a layer in the pipeline split (94 + 2 = 16 stages × 6:
    the first stage holds the embedding and 5 layers, the last 5 layers and the output layer), bfloat16 activations
    between stages; Megatron-Bridge's ``_pretrain_common`` training values (300000 steps, micro-batch 1, 500
    warmup steps) with its global batch 32: 16 micro-batches per data-parallel rank at DP 2 on 256 GPUs. EP folds
    over the TP × CP × DP ranks of a stage (ETP 1: 16 ranks per stage, EP 8 × expert-data 2), as in megatron-core.
    """
    model = qwen3_moe_model(94, 4096, 12288, 64, 1536, tensor_model_parallel_size=4, pipeline_model_parallel_size=16,
                            context_parallel_size=2, expert_model_parallel_size=8, sequence_parallel=True,
                            account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True,
                            pipeline_dtype="bfloat16")
    cfg = _mb_training(pretrain_common(model))
    cfg.train.micro_batch_size = 1  # global batch 32: 16 micro-batches per DP rank at DP 2, as there
    return apply_common_overrides(cfg, **overrides)


def _mb_training(cfg: ConfigContainer) -> ConfigContainer:
    """Megatron-Bridge's ``_pretrain_common`` training values, which its Qwen3-MoE recipes start from: 300000 steps
    of 32 samples, micro-batch 2, 500 warmup steps, eval every 500 steps over 32 batches, the distributed optimizer
    sharding optimizer state, gradients and parameters."""
    cfg.train.train_iters, cfg.train.global_batch_size, cfg.train.micro_batch_size = 300_000, 32, 2
    cfg.scheduler.lr_warmup_iters = 500
    cfg.validation.eval_interval, cfg.validation.eval_iters = 500, 32
    cfg.ddp.data_parallel_sharding_strategy = "optim_grads_params"
    return cfg


__all__ = [
    "qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config",
    "qwen3_30b_a3b_pretrain_config",
    "qwen3_235b_a22b_pretrain_config",
    "qwen3_moe_model",
]
