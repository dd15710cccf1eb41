"""Qwen3 dense and Qwen3-MoE pretraining recipes, at Megatron-Bridge's import paths: ``recipes.qwen`` holds the
Qwen3 pretraining names of its ``recipes/qwen/__init__.py`` (SFT/PEFT, Qwen2/2.5, Qwen3-Next and Qwen3.5 are not
shipped: docs/megatron-bridge-differences.md), ``recipes.qwen.h100`` and ``recipes.qwen.gb200`` its per-GPU names."""

from megatron_bridge.recipes.qwen.gb200.qwen3_moe import qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_functional_config
from megatron_bridge.recipes.qwen.qwen3 import (
    qwen3_1p7b_pretrain_config,
    qwen3_4b_pretrain_config,
    qwen3_8b_pretrain_config,
    qwen3_14b_pretrain_config,
    qwen3_32b_pretrain_config,
    qwen3_600m_pretrain_config,
)
from megatron_bridge.recipes.qwen.qwen3_moe import qwen3_30b_a3b_pretrain_config, qwen3_235b_a22b_pretrain_config


__all__ = [
    "qwen3_600m_pretrain_config",
    "qwen3_1p7b_pretrain_config",
    "qwen3_4b_pretrain_config",
    "qwen3_8b_pretrain_config",
    "qwen3_14b_pretrain_config",
    "qwen3_32b_pretrain_config",
    "qwen3_30b_a3b_pretrain_config",
    "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_functional_config",
    "qwen3_235b_a22b_pretrain_config",
]
