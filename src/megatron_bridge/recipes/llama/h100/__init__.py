"""Megatron-Bridge's per-GPU H100 Llama pretraining names (``megatron.bridge.recipes.llama.h100``)."""

from megatron_bridge.recipes.llama.h100.llama3 import *  # noqa: F403
from megatron_bridge.recipes.llama.h100.llama3 import __all__  # noqa: F401
