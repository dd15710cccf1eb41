"""Megatron-Bridge's OmegaConf override utilities (``megatron.bridge.training.utils.omegaconf_utils``) over this
library's config: ``create_omegaconf_dict_config``, ``apply_overrides``, ``parse_hydra_overrides``,
``process_config_with_overrides`` and ``OverridesError``.

The work is :mod:`megatron_bridge.config.serialization`'s (the YAML and ``a.b=c`` overrides of ``run_recipe.py``):
the same strict keys and types, Megatron-Bridge's moved keys (``train.eval_iters``) mapped with one logged line.
Differences (docs/megatron-bridge-differences.md): an unknown key is refused naming the nearest one, where
Megatron-Bridge logs a warning and skips it; Hydra's ``+key``/``~key`` forms are refused (every field exists already;
set it, or set it to ``null``); the config holds no callables, so ``excluded_fields`` is empty.
"""

import dataclasses
import difflib
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from megatron_bridge.config.deprecated import move_deprecated_keys
from megatron_bridge.config.serialization import apply_overrides as apply_yaml_and_overrides
from megatron_bridge.config.serialization import from_dict, merge, parse_overrides, to_dict
from megatron_bridge.errors import ConfigOverrideError, OverridesError
from megatron_bridge.utils.logging import get_logger


__all__ = ["OverridesError", "apply_overrides", "create_omegaconf_dict_config", "parse_hydra_overrides",
           "process_config_with_overrides"]

logger = get_logger(__name__)

DataclassInstance = TypeVar("DataclassInstance")


def create_omegaconf_dict_config(config_container: Any) -> tuple[DictConfig, dict[str, Any]]:
    """The config as an OmegaConf ``DictConfig`` (its YAML form) and the fields left out of it (none here: the config
    holds no callables)."""
    if not dataclasses.is_dataclass(config_container):
        raise ConfigOverrideError(
            f"create_omegaconf_dict_config takes a config dataclass (a ConfigContainer or a section), not a "
            f"{type(config_container).__name__}"
        )
    return OmegaConf.create(to_dict(config_container)), {}


def apply_overrides(config_obj: DataclassInstance, overrides_dict: dict[str, Any],
                    excluded_fields: dict[str, Any]) -> None:
    """Set ``config_obj``'s fields (in place) from the nested ``overrides_dict`` (keys it leaves out keep their
    values), then restore ``excluded_fields``. Unknown keys and wrong types raise ConfigOverrideError naming the
    key; the result is checked as a whole before anything is set."""
    data = merge(to_dict(config_obj), move_deprecated_keys(dict(overrides_dict)))
    _copy_fields(from_dict(type(config_obj), data), config_obj)
    for path, value in excluded_fields.items():
        _set_path(config_obj, path, value)


def parse_hydra_overrides(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """``cfg`` with the ``key=value`` overrides merged; a key ``cfg`` lacks, or a value that does not parse, raises
    OverridesError (Megatron-Bridge: struct mode, the same)."""
    return OmegaConf.merge(cfg, OmegaConf.create(_checked_overrides(cfg, overrides)))


def process_config_with_overrides(config: DataclassInstance, config_filepath: str | Path | None = None,
                                  cli_overrides: list[str] | None = None) -> DataclassInstance:
    """``config`` (changed in place and returned) < the YAML file < the ``key=value`` overrides — what
    ``run_recipe.py --config-file`` does."""
    if cli_overrides:
        _checked_overrides(create_omegaconf_dict_config(config)[0], cli_overrides, log=False)  # OverridesError
    updated = apply_yaml_and_overrides(config, config_filepath or None, list(cli_overrides or []))
    _copy_fields(updated, config)
    return config


def _checked_overrides(cfg: DictConfig, overrides: list[str], log: bool = True) -> dict[str, Any]:
    """The overrides as a nested dict (moved keys moved); OverridesError for what does not parse or is not in
    ``cfg``."""
    try:
        parsed = move_deprecated_keys(parse_overrides(list(overrides)), log=log)
    except ConfigOverrideError as exc:
        raise OverridesError(f"Failed to parse Hydra overrides: {exc}") from exc
    _check_keys_exist(cfg, parsed, "")
    return parsed


def _copy_fields(source: Any, target: Any) -> None:
    for f in dataclasses.fields(target):
        if f.init:
            setattr(target, f.name, getattr(source, f.name))


def _set_path(obj: Any, path: str, value: Any) -> None:
    """Set Megatron-Bridge's excluded-field path (``root.model.activation_func``) on ``obj``."""
    *parents, leaf = path.removeprefix("root.").split(".")
    for name in parents:
        obj = getattr(obj, name)
    setattr(obj, leaf, value)


def _check_keys_exist(node: DictConfig, parsed: dict[str, Any], prefix: str) -> None:
    for key, value in parsed.items():
        if key not in node:
            near = difflib.get_close_matches(str(key), [str(k) for k in node], n=1)
            hint = f"; did you mean '{prefix}{near[0]}'?" if near else ""
            raise OverridesError(f"Failed to parse Hydra overrides: the config has no key '{prefix}{key}'{hint}")
        child = node[key]
        if isinstance(value, dict) and isinstance(child, DictConfig):
            _check_keys_exist(child, value, f"{prefix}{key}.")
