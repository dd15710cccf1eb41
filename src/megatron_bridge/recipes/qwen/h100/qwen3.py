"""Megatron-Bridge's per-GPU H100 Qwen3 dense pretraining names (``recipes/qwen/h100/qwen3.py``): each is the recipe
of :mod:`megatron_bridge.recipes.qwen.qwen3` it stands for."""

from megatron_bridge.recipes.qwen.qwen3 import (
    qwen3_1p7b_pretrain_config,
    qwen3_4b_pretrain_config,
    qwen3_8b_pretrain_4gpu_h100_bf16_config,
    qwen3_8b_pretrain_config,
    qwen3_14b_pretrain_config,
    qwen3_32b_pretrain_config,
    qwen3_600m_pretrain_config,
)


qwen3_600m_pretrain_1gpu_h100_bf16_config = qwen3_600m_pretrain_config
qwen3_1p7b_pretrain_1gpu_h100_bf16_config = qwen3_1p7b_pretrain_config
qwen3_4b_pretrain_2gpu_h100_bf16_config = qwen3_4b_pretrain_config
qwen3_8b_pretrain_16gpu_h100_bf16_config = qwen3_8b_pretrain_config
qwen3_14b_pretrain_8gpu_h100_bf16_config = qwen3_14b_pretrain_config
qwen3_32b_pretrain_16gpu_h100_bf16_config = qwen3_32b_pretrain_config


__all__ = [
    "qwen3_14b_pretrain_8gpu_h100_bf16_config",
    "qwen3_1p7b_pretrain_1gpu_h100_bf16_config",
    "qwen3_32b_pretrain_16gpu_h100_bf16_config",
    "qwen3_4b_pretrain_2gpu_h100_bf16_config",
    "qwen3_600m_pretrain_1gpu_h100_bf16_config",
    "qwen3_8b_pretrain_16gpu_h100_bf16_config",
    "qwen3_8b_pretrain_4gpu_h100_bf16_config",
]
