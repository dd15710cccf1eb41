"""Recipes: plain functions returning a validated-ready ``ConfigContainer``.

``RECIPES`` maps each recipe name to its function and the world size it is laid out for (``validate()`` passes at that
world size), with the recipes of the model families in their own folders (``families/<name>/recipes.py``, through
the registry); their functions are attributes of this package too. Importing this package loads no torch,
megatron-fsdp, megatron-core or tensorboard.

As Megatron-Bridge's ``megatron.bridge.recipes``, which star-imports every family and its ``h100`` module, this
package also holds the per-GPU names (``llama3_8b_pretrain_2gpu_h100_bf16_config``, ...) of ``recipes.llama.h100``
and ``recipes.qwen.h100``, and the names of ``recipes.qwen`` (its GB200 Qwen3-MoE name).
"""

import re

from megatron_bridge.config.families import family_recipes
from megatron_bridge.recipes.base import RecipeInfo
from megatron_bridge.recipes.llama import (
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
from megatron_bridge.recipes.llama.h100 import *  # noqa: F403
from megatron_bridge.recipes.llama.h100 import __all__ as _LLAMA_H100
from megatron_bridge.recipes.qwen import *  # noqa: F403
from megatron_bridge.recipes.qwen import __all__ as _QWEN
from megatron_bridge.recipes.qwen import (
    qwen3_1p7b_pretrain_config,
    qwen3_4b_pretrain_config,
    qwen3_8b_pretrain_config,
    qwen3_14b_pretrain_config,
    qwen3_30b_a3b_pretrain_config,
    qwen3_32b_pretrain_config,
    qwen3_235b_a22b_pretrain_config,
    qwen3_600m_pretrain_config,
)
from megatron_bridge.recipes.qwen.h100 import *  # noqa: F403
from megatron_bridge.recipes.qwen.h100 import __all__ as _QWEN_H100
from megatron_bridge.recipes.tiny import tiny_llama_pretrain_config, tiny_moe_pretrain_config


_BUILT_IN: dict[str, RecipeInfo] = {
    "tiny_llama": RecipeInfo(tiny_llama_pretrain_config, 2),
    "tiny_moe": RecipeInfo(tiny_moe_pretrain_config, 2),
    "llama3_8b": RecipeInfo(llama3_8b_pretrain_config, 2),
    "llama3_8b_16k": RecipeInfo(llama3_8b_16k_pretrain_config, 16),
    "llama3_8b_64k": RecipeInfo(llama3_8b_64k_pretrain_config, 32),
    "llama3_8b_128k": RecipeInfo(llama3_8b_128k_pretrain_config, 64),
    "llama3_8b_low_precision": RecipeInfo(llama3_8b_low_precision_pretrain_config, 2),
    "llama3_70b": RecipeInfo(llama3_70b_pretrain_config, 32),
    "llama3_70b_16k": RecipeInfo(llama3_70b_16k_pretrain_config, 32),
    "llama3_70b_64k": RecipeInfo(llama3_70b_64k_pretrain_config, 256),
    "llama3_70b_deterministic": RecipeInfo(llama3_70b_pretrain_deterministic_config, 32),
    "llama31_8b": RecipeInfo(llama31_8b_pretrain_config, 2),
    "llama31_70b": RecipeInfo(llama31_70b_pretrain_config, 32),
    "llama31_405b": RecipeInfo(llama31_405b_pretrain_config, 256),
    "llama31_405b_deterministic": RecipeInfo(llama31_405b_pretrain_deterministic_config, 256),
    "llama32_1b": RecipeInfo(llama32_1b_pretrain_config, 1),
    "llama32_3b": RecipeInfo(llama32_3b_pretrain_config, 1),
    "qwen3_600m": RecipeInfo(qwen3_600m_pretrain_config, 1),
    "qwen3_1p7b": RecipeInfo(qwen3_1p7b_pretrain_config, 1),
    "qwen3_4b": RecipeInfo(qwen3_4b_pretrain_config, 2),
    "qwen3_8b": RecipeInfo(qwen3_8b_pretrain_config, 16),
    "qwen3_14b": RecipeInfo(qwen3_14b_pretrain_config, 8),
    "qwen3_32b": RecipeInfo(qwen3_32b_pretrain_config, 16),
    "qwen3_30b_a3b": RecipeInfo(qwen3_30b_a3b_pretrain_config, 16),
    "qwen3_235b_a22b": RecipeInfo(qwen3_235b_a22b_pretrain_config, 256),
}
"""The recipes of this package; :func:`all_recipes` adds the family folders' ones."""
_ALL: dict[str, RecipeInfo] = {}
RECIPES: dict[str, RecipeInfo]  # declared only: module __getattr__ builds it on first use (all_recipes)


def all_recipes() -> dict[str, RecipeInfo]:
    """Every recipe: this package's and the family folders' (``families/<name>/recipes.py``, through the registry),
    built on first use. A family's recipes module imports ``megatron_bridge.recipes.base``, which runs this package
    first: reading them at import time would import that module while it is half-initialized."""
    if not _ALL:
        _ALL.update({**_BUILT_IN, **family_recipes()})
    return _ALL


_PER_GPU_NAME = re.compile(r"_pretrain_(\d+)gpu_\w+_config$")
"""Megatron-Bridge's per-GPU recipe names (``qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config``): N GPUs."""


def get_recipe(name: str) -> RecipeInfo:
    """Look up a recipe by name (with or without the ``_pretrain_config`` suffix), by its function's name
    (``llama3_70b_pretrain_deterministic_config``) or by a Megatron-Bridge per-GPU name this package exports
    (``qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config``: its world size is the name's GPU count)."""
    from megatron_bridge.errors import ConfigValidationError

    key = name.removesuffix("_pretrain_config")
    recipes = all_recipes()
    by_function = {info.fn.__name__: info for info in recipes.values()}
    if key not in recipes and name in by_function:
        return by_function[name]
    per_gpu = _PER_GPU_NAME.search(name)
    if key not in recipes and per_gpu and callable(globals().get(name)):  # Megatron-Bridge's per-GPU names
        return RecipeInfo(globals()[name], int(per_gpu.group(1)))
    if key not in recipes:
        raise ConfigValidationError(f"unknown recipe {name!r}; known: {sorted(recipes)}", ("recipe",))
    return recipes[key]


def __getattr__(name: str) -> object:
    """``RECIPES`` (:func:`all_recipes`), or a family folder's recipe function by its name
    (``megatron_bridge.recipes.mistral_7b_pretrain_config``)."""
    if name == "RECIPES":
        return all_recipes()
    for info in all_recipes().values():
        if info.fn.__name__ == name:
            return info.fn
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "RECIPES",
    "RecipeInfo",
    "get_recipe",
    "llama3_8b_pretrain_config",
    "llama3_8b_16k_pretrain_config",
    "llama3_8b_64k_pretrain_config",
    "llama3_8b_128k_pretrain_config",
    "llama3_8b_low_precision_pretrain_config",
    "llama3_70b_16k_pretrain_config",
    "llama3_70b_64k_pretrain_config",
    "llama3_70b_pretrain_config",
    "llama3_70b_pretrain_deterministic_config",
    "llama31_8b_pretrain_config",
    "llama31_70b_pretrain_config",
    "llama31_405b_pretrain_config",
    "llama31_405b_pretrain_deterministic_config",
    "llama32_1b_pretrain_config",
    "llama32_3b_pretrain_config",
    "qwen3_600m_pretrain_config",
    "qwen3_1p7b_pretrain_config",
    "qwen3_4b_pretrain_config",
    "qwen3_8b_pretrain_config",
    "qwen3_14b_pretrain_config",
    "qwen3_32b_pretrain_config",
    "qwen3_30b_a3b_pretrain_config",
    "qwen3_235b_a22b_pretrain_config",
    "tiny_llama_pretrain_config",
    "tiny_moe_pretrain_config",
]
__all__ += sorted({*_LLAMA_H100, *_QWEN, *_QWEN_H100} - set(__all__))
