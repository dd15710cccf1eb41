"""Megatron-Bridge's per-GPU H100 Qwen3 pretraining names (``megatron.bridge.recipes.qwen.h100``; its Qwen2/2.5 and
Qwen3-Next names are not shipped here)."""

from megatron_bridge.recipes.qwen.h100.qwen3 import *  # noqa: F403
from megatron_bridge.recipes.qwen.h100.qwen3 import __all__ as _DENSE
from megatron_bridge.recipes.qwen.h100.qwen3_moe import *  # noqa: F403
from megatron_bridge.recipes.qwen.h100.qwen3_moe import __all__ as _MOE


__all__ = [*_DENSE, *_MOE]
