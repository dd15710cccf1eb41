"""The family registry: every registered family's spec and Bridge mapping load; ``model.family`` is declared by the
recipes, saved in YAML, and inferred (logged) for configs written before the field existed; export dispatches on it."""

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.families import (
    FAMILY_PACKAGES,
    all_families,
    family_for_architecture,
    family_names,
    get_family,
    inferred_family,
    load_family_object,
)
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.recipes import RECIPES, get_recipe


def test_every_registered_family_loads_with_its_own_name() -> None:
    archs = [a for spec in all_families() for a in spec.hf_architectures]
    assert len(archs) == len(set(archs)), "an HF architecture is claimed by two families"
    for name in family_names():
        spec = get_family(name)
        assert spec.name == name and FAMILY_PACKAGES[name].endswith(f".{name}")
        from megatron_bridge.bridge.families import family_by_name

        bridge = family_by_name(name)
        assert bridge.name == name and bridge.architectures == spec.hf_architectures
        for arch in spec.hf_architectures:
            assert family_for_architecture(arch) is spec


def test_unknown_family_is_a_named_error() -> None:
    with pytest.raises(ConfigValidationError, match=r"model.family='lama' is not a registered model family"):
        get_family("lama")


def test_spec_targets_stay_inside_the_family_package() -> None:
    spec = get_family("llama")
    with pytest.raises(TypeError, match="inside megatron_bridge.families.llama"):
        load_family_object(spec, "os:system")


def test_registry_and_specs_import_no_torch() -> None:
    code = ("import sys; from megatron_bridge.config.families import all_families; all_families(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_declares_a_registered_family(name: str) -> None:
    family = get_recipe(name).fn().model.family
    assert family in family_names() or (family is None and name == "tiny_moe")


@pytest.mark.parametrize(("recipe", "family"), [("llama3_8b", "llama"), ("qwen3_8b", "qwen3"),
                                                ("qwen3_30b_a3b", "qwen3_moe")])
def test_config_written_before_the_field_loads_as_its_family(recipe: str, family: str, tmp_path: Path) -> None:
    """A YAML without ``model.family`` (as every config and checkpoint before this change) loads with None and
    ``finalize()`` sets the family its shape had, logged once."""
    cfg = get_recipe(recipe).fn()
    assert cfg.model.family == family and f"family: {family}" in cfg.to_yaml()
    old = tmp_path / "run_config.yaml"
    old.write_text(re.sub(rf"^ *family: {family}\n", "", cfg.to_yaml(), flags=re.M))
    loaded = ConfigContainer.from_yaml(old)
    assert loaded.model.family is None and inferred_family(loaded.model) == family
    from megatron_bridge.config import adjustments

    adjustments._LOGGED.discard(f"adjust:model.family={family!r}")  # logged once per process: another test may have
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append  # type: ignore[method-assign]
    adjustments.logger.addHandler(handler)  # directly: an earlier pretrain() may have stopped its propagation
    level = adjustments.logger.level
    adjustments.logger.setLevel(logging.INFO)
    try:
        loaded.finalize()
    finally:
        adjustments.logger.removeHandler(handler)
        adjustments.logger.setLevel(level)
    assert loaded.model.family == family
    assert any("set model.family" in r.getMessage() for r in records)


def test_export_dispatches_on_the_declared_family_not_the_shape() -> None:
    from megatron_bridge.bridge.families import family_for_model_config
    from megatron_bridge.errors import BridgeError

    model = get_recipe("qwen3_8b").fn().model
    assert family_for_model_config(model).architectures[0] == "Qwen3ForCausalLM"
    model.family = "llama"  # a Qwen3 shape declared as Llama: refused by name, not exported as the other
    with pytest.raises(BridgeError, match="is not a llama model"):
        family_for_model_config(model).config_to_hf(model)


@pytest.mark.parametrize("module", ["megatron_bridge.families.mistral.recipes",
                                    "megatron_bridge.families.mixtral.recipes"])
def test_a_family_recipes_module_imports_first(module: str) -> None:
    """Importing a family's recipes module before ``megatron_bridge.recipes`` works (that package lists the family
    recipes on first use, not while the family module that imported it is half-initialized)."""
    code = f"import {module} as m; from megatron_bridge.recipes import RECIPES; print(set(m.RECIPES) <= set(RECIPES))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
