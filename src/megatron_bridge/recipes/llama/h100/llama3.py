"""Megatron-Bridge's per-GPU Llama 3 / 3.1 / 3.2 pretraining names (``recipes/llama/h100/llama3.py``): each is the
recipe of :mod:`megatron_bridge.recipes.llama.llama3` it stands for (Megatron-Bridge's short names are aliases of
these), plus the two low-precision Llama 3 8B variants that have no short name (MXFP8, NVFP4)."""

from typing import Any

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.recipes.llama.llama3 import (
    llama3_8b_16k_pretrain_config,
    llama3_8b_64k_pretrain_config,
    llama3_8b_128k_pretrain_config,
    llama3_8b_low_precision,
    llama3_8b_low_precision_pretrain_config,
    llama3_8b_pretrain_config,
    llama3_70b_16k_pretrain_config,
    llama3_70b_64k_pretrain_config,
    llama3_70b_pretrain_config,
    llama3_70b_pretrain_deterministic_config,
    llama31_8b_pretrain_config,
    llama31_70b_pretrain_config,
    llama31_405b_pretrain_config,
    llama31_405b_pretrain_deterministic_config,
    llama32_1b_pretrain_config,
    llama32_3b_pretrain_config,
)


llama32_1b_pretrain_1gpu_h100_bf16_config = llama32_1b_pretrain_config
llama32_3b_pretrain_1gpu_h100_bf16_config = llama32_3b_pretrain_config
llama3_8b_pretrain_2gpu_h100_bf16_config = llama3_8b_pretrain_config
llama3_8b_pretrain_16gpu_h100_bf16_16k_config = llama3_8b_16k_pretrain_config
llama3_8b_pretrain_32gpu_h100_bf16_64k_config = llama3_8b_64k_pretrain_config
llama3_8b_pretrain_64gpu_h100_bf16_128k_config = llama3_8b_128k_pretrain_config
llama3_8b_pretrain_2gpu_h100_fp8cs_config = llama3_8b_low_precision_pretrain_config
llama3_70b_pretrain_32gpu_h100_bf16_config = llama3_70b_pretrain_config
llama3_70b_pretrain_32gpu_h100_bf16_deterministic_config = llama3_70b_pretrain_deterministic_config
llama3_70b_pretrain_32gpu_h100_bf16_16k_config = llama3_70b_16k_pretrain_config
llama3_70b_pretrain_256gpu_h100_bf16_64k_config = llama3_70b_64k_pretrain_config
llama31_8b_pretrain_2gpu_h100_bf16_config = llama31_8b_pretrain_config
llama31_70b_pretrain_32gpu_h100_bf16_config = llama31_70b_pretrain_config
llama31_405b_pretrain_256gpu_h100_bf16_config = llama31_405b_pretrain_config
llama31_405b_pretrain_256gpu_h100_bf16_deterministic_config = llama31_405b_pretrain_deterministic_config


def llama3_8b_pretrain_2gpu_h100_fp8mx_config(**overrides: Any) -> ConfigContainer:
    """Llama 3 8B in MXFP8 (``bf16_with_mxfp8_mixed``), 2 GPUs, global batch 768, lr 6e-4 → 6e-6. MXFP8 needs a
    Blackwell GPU (compute capability >= 10.0; rule ``fp8_requirements``) despite the name."""
    return llama3_8b_low_precision("bf16_with_mxfp8_mixed", overrides)


def llama3_8b_pretrain_2gpu_h100_nvfp4_config(**overrides: Any) -> ConfigContainer:
    """Llama 3 8B in NVFP4 (``bf16_with_nvfp4_mixed``, the last 4 layers in bf16), 2 GPUs, global batch 768, lr
    6e-4 → 6e-6. NVFP4 runs on transformer-engine only (``model.engine="megatron_core"``,
    ``transformer_impl="transformer_engine"``) on a Blackwell GPU (rule ``fp8_requirements``)."""
    return llama3_8b_low_precision("bf16_with_nvfp4_mixed", overrides)


__all__ = [
    "llama31_405b_pretrain_256gpu_h100_bf16_config",
    "llama31_405b_pretrain_256gpu_h100_bf16_deterministic_config",
    "llama31_70b_pretrain_32gpu_h100_bf16_config",
    "llama31_8b_pretrain_2gpu_h100_bf16_config",
    "llama32_1b_pretrain_1gpu_h100_bf16_config",
    "llama32_3b_pretrain_1gpu_h100_bf16_config",
    "llama3_70b_pretrain_256gpu_h100_bf16_64k_config",
    "llama3_70b_pretrain_32gpu_h100_bf16_16k_config",
    "llama3_70b_pretrain_32gpu_h100_bf16_config",
    "llama3_70b_pretrain_32gpu_h100_bf16_deterministic_config",
    "llama3_8b_pretrain_16gpu_h100_bf16_16k_config",
    "llama3_8b_pretrain_2gpu_h100_bf16_config",
    "llama3_8b_pretrain_2gpu_h100_fp8cs_config",
    "llama3_8b_pretrain_2gpu_h100_fp8mx_config",
    "llama3_8b_pretrain_2gpu_h100_nvfp4_config",
    "llama3_8b_pretrain_32gpu_h100_bf16_64k_config",
    "llama3_8b_pretrain_64gpu_h100_bf16_128k_config",
]
