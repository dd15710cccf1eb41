"""Megatron-Bridge's per-GPU GB200 Qwen3 pretraining names (``megatron.bridge.recipes.qwen.gb200``; its Qwen3.5
names are not shipped here)."""

from megatron_bridge.recipes.qwen.gb200.qwen3_moe import qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_functional_config


__all__ = ["qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_functional_config"]
