"""Megatron-Bridge's per-GPU H100 Qwen3-MoE pretraining names (``recipes/qwen/h100/qwen3_moe.py``): each is the
recipe of :mod:`megatron_bridge.recipes.qwen.qwen3_moe` it stands for, at Megatron-Bridge's world size."""

from megatron_bridge.recipes.qwen.qwen3_moe import (
    qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config,
    qwen3_30b_a3b_pretrain_config,
    qwen3_235b_a22b_pretrain_config,
)


qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config = qwen3_30b_a3b_pretrain_config
qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config = qwen3_235b_a22b_pretrain_config


__all__ = [
    "qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config",
    "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config",
    "qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config",
]
