"""Llama 3 / 3.1 / 3.2 pretraining recipes, at Megatron-Bridge's import paths: ``recipes.llama`` holds the names
of its ``recipes/llama/__init__.py`` (pretraining ones; SFT/PEFT are out of scope, docs/megatron-bridge-differences.md)
and ``recipes.llama.h100`` its per-GPU names."""

from megatron_bridge.recipes.llama.llama3 import (
    llama3_8b_16k_pretrain_config,
    llama3_8b_64k_pretrain_config,
    llama3_8b_128k_pretrain_config,
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


__all__ = [
    "llama3_8b_pretrain_config",
    "llama3_8b_16k_pretrain_config",
    "llama3_8b_64k_pretrain_config",
    "llama3_8b_128k_pretrain_config",
    "llama3_8b_low_precision_pretrain_config",
    "llama3_70b_pretrain_config",
    "llama3_70b_pretrain_deterministic_config",
    "llama3_70b_16k_pretrain_config",
    "llama3_70b_64k_pretrain_config",
    "llama31_8b_pretrain_config",
    "llama31_70b_pretrain_config",
    "llama31_405b_pretrain_config",
    "llama31_405b_pretrain_deterministic_config",
    "llama32_1b_pretrain_config",
    "llama32_3b_pretrain_config",
]
