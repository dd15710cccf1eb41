"""The Hugging Face side of the model families: the mapping base class and the lookup by name, architecture or
model config. Each family's own mapping is ``bridge.py`` in its folder (``src/megatron_bridge/families/<name>/``),
registered in ``config/families.py`` (docs/models/adding-a-family.md).
"""

from megatron_bridge.bridge.families.base import (
    ModelFamily,
    family_by_name,
    family_for_hf_config,
    family_for_model_config,
    family_names,
    supported_architectures,
)


__all__ = [
    "ModelFamily",
    "family_by_name",
    "family_for_hf_config",
    "family_for_model_config",
    "family_names",
    "supported_architectures",
]
