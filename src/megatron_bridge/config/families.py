"""The registry of model families: ``model.family`` names one, and everything family-specific is asked of its spec.

A family is one folder, ``src/megatron_bridge/families/<name>/``, whose ``__init__.py`` defines ``SPEC``, a
:class:`FamilySpec` (torch-free), and whose other modules hold what the spec points to: the Hugging Face mapping
(``bridge.py``) and the recipes (``recipes.py``). :data:`FAMILY_PACKAGES` is the registration: one line per family.

The folders sit above the floors they plug into (docs/architecture.md): this module loads a family's package by its
name when a lower floor asks for it (:func:`get_family`), the one place a family package is imported from below.
Nothing here imports torch; a family's ``__init__`` must not either.
"""

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from megatron_bridge.errors import ConfigValidationError


if TYPE_CHECKING:
    from megatron_bridge.config.model import ModelConfig


@dataclass(frozen=True)
class FamilySpec:
    """What a model family declares (its folder's ``SPEC``)."""

    name: str
    """The ``model.family`` value, e.g. ``"mistral"``."""
    hf_architectures: tuple[str, ...]
    """Hugging Face ``architectures`` its Bridge mapping reads; the first one is written on export."""
    hf_model_type: str
    """Hugging Face ``model_type`` (written on export; read when a config.json has no ``architectures``)."""
    perf_family: str
    """Megatron-Bridge's performance-launcher family (``launch.py -m``/``--model_family_name``), e.g. ``"qwen"``
    for Qwen3 and Qwen3-MoE."""
    bridge: str
    """``module:Class`` of its Hugging Face mapping (a ``bridge.families.base.ModelFamily``), imported on first use."""
    recipes: str | None = None
    """Module whose ``RECIPES`` dict (short name → ``RecipeInfo``) registers the family's recipes; None: none yet."""
    summary: str = ""
    """One line for the support matrix and ``--help``: what sets the family apart."""


FAMILY_PACKAGES: dict[str, str] = {
    "llama": "megatron_bridge.families.llama",
    "qwen3": "megatron_bridge.families.qwen3",
    "qwen3_moe": "megatron_bridge.families.qwen3_moe",
    "mistral": "megatron_bridge.families.mistral",
    "mixtral": "megatron_bridge.families.mixtral",
    "deepseek_v3": "megatron_bridge.families.deepseek_v3",
    "deepseek_v2": "megatron_bridge.families.deepseek_v2",
    "gemma3": "megatron_bridge.families.gemma3",
    "gemma2": "megatron_bridge.families.gemma2",
    "gpt_oss": "megatron_bridge.families.gpt_oss",
}
"""Every registered family: ``model.family`` value → its folder's package. Adding a family adds one line here."""

_SPECS: dict[str, FamilySpec] = {}


def family_names() -> list[str]:
    """The registered family names, in registration order."""
    return list(FAMILY_PACKAGES)


def get_family(name: str) -> FamilySpec:
    """The spec of the family registered as ``name``.

    Raises:
        ConfigValidationError: ``name`` is not registered (names ``model.family`` and the registered names).
    """
    if name not in FAMILY_PACKAGES:
        raise ConfigValidationError(
            f"model.family={name!r} is not a registered model family; set one of {family_names()} "
            "(adding a family: docs/models/adding-a-family.md)", ("model.family",))
    spec = _SPECS.get(name)
    if spec is None:
        spec = importlib.import_module(FAMILY_PACKAGES[name]).SPEC
        if not isinstance(spec, FamilySpec) or spec.name != name:
            raise TypeError(f"{FAMILY_PACKAGES[name]}.SPEC must be a FamilySpec named {name!r}")
        _SPECS[name] = spec
    return spec


def load_family_object(spec: FamilySpec, target: str) -> object:
    """The object ``target`` (``"module:attr"``, one of ``spec``'s fields) names, imported on first use; only modules
    of the family's own package are loaded.

    Raises:
        TypeError: ``target`` lies outside the family's package (a programming error in its spec).
    """
    module, _, attr = target.partition(":")
    if not attr:
        raise TypeError(f"{target!r} (a field of the {spec.name} family's spec) must be 'module:attr'")
    return getattr(importlib.import_module(_inside(spec, module)), attr)


def _inside(spec: FamilySpec, module: str) -> str:
    """``module`` when it lies in ``spec``'s own package; TypeError otherwise."""
    package = FAMILY_PACKAGES[spec.name]
    if module != package and not module.startswith(package + "."):
        raise TypeError(f"{module!r} (named by the {spec.name} family's spec) must lie inside {package}")
    return module


def family_recipes() -> dict[str, object]:
    """Every family folder's recipes (its recipes module's ``RECIPES``: short name → ``RecipeInfo``), in
    registration order."""
    out: dict[str, object] = {}
    for spec in all_families():
        if spec.recipes is not None:
            out.update(importlib.import_module(_inside(spec, spec.recipes)).RECIPES)
    return out


def all_families() -> list[FamilySpec]:
    """Every registered family's spec, in registration order."""
    return [get_family(name) for name in FAMILY_PACKAGES]


def family_for_architecture(architecture: str) -> FamilySpec | None:
    """The registered family that reads Hugging Face ``architecture``; None when none does."""
    return next((spec for spec in all_families() if architecture in spec.hf_architectures), None)


def family_for_model_type(model_type: object) -> FamilySpec | None:
    """The registered family whose Hugging Face ``model_type`` is ``model_type``; None when none is."""
    return next((spec for spec in all_families() if spec.hf_model_type == model_type), None)


def inferred_family(model: "ModelConfig") -> str:
    """The family of a model config written before ``model.family`` existed, from the shape the three families of
    that time had: mixture of experts with q/k norm → ``qwen3_moe``, q/k norm → ``qwen3``, else ``llama``."""
    if model.qk_layernorm:
        return "qwen3_moe" if model.is_moe else "qwen3"
    return "llama"


def resolved_family(model: "ModelConfig") -> str:
    """``model.family``, or for a config that names none (written before the field existed) :func:`inferred_family`."""
    return model.family if model.family is not None else inferred_family(model)
