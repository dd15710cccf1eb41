"""Config sections take only the fields they declare, from Python as from YAML and ``a.b=c`` overrides.

``cfg.train.micro_batch_sise = 4`` is a :class:`~megatron_bridge.errors.ConfigValidationError` naming the section,
the name and the nearest field; a Megatron-Bridge name this library dropped or moved (``RETIRED_NAMES``) is refused
with its replacement. :func:`unknown_key_message` is the one message for an unknown key: the YAML and override reader
(:mod:`.serialization`) uses it too.

A ``torch.dtype`` assigned to a field (``provider.params_dtype = torch.bfloat16``, as Megatron-Bridge's examples do)
is stored as its name (``"bfloat16"``): config fields hold YAML-safe values, and this module imports no torch.

Names starting with ``_`` are not checked: they are internal state (``GPTModelProvider``'s wrap hooks), never fields.
"""

import dataclasses
import difflib
import typing
from collections.abc import Sequence
from functools import cache
from typing import Any, TypeVar

from megatron_bridge.errors import ConfigValidationError


T = TypeVar("T", bound=type)

_NO_WANDB = "no W&B, MLflow or Comet here: TensorBoard only (logger.tensorboard_dir; docs/training/logging.md)"
_NOT_LOGGED = "no such logger field here (docs/training/logging.md lists the switches); delete the setting"

RETIRED_NAMES: dict[str, str] = {
    "dist.use_tp_pp_dp_mapping": "the device mesh has one fixed rank order (pp, dp, cp, tp); delete the setting",
    "train.eval_iters": "deprecated in Megatron-Bridge too; set validation.eval_iters (YAML and overrides move "
                        "it there, logged: config/deprecated.py)",
    "train.eval_interval": "deprecated in Megatron-Bridge too; set validation.eval_interval (YAML and overrides "
                           "move it there, logged: config/deprecated.py)",
    "train.skip_train": "deprecated in Megatron-Bridge too; evaluation-only runs are not supported here",
    **{f"logger.{name}": _NOT_LOGGED for name in (
        "log_energy", "log_num_zeros_in_grad", "log_l2_norm_grad_to_tensorboard", "log_memory_interval",
        "log_device_memory_used", "log_max_attention_logit", "timing_log_option", "barrier_with_L1_time")},
    **{f"logger.wandb_{name}": _NO_WANDB for name in ("project", "exp_name", "save_dir", "entity")},
}
"""Megatron-Bridge config keys (``section.name``) that this library does not take, and what to do instead. Setting
one, from Python, YAML or an override, is an error with this text (docs/megatron-bridge-differences.md); the two
deprecated ``train.eval_*`` keys are moved to ``validation`` when read from YAML or overrides, as Megatron-Bridge
does (:mod:`megatron_bridge.config.deprecated`)."""


def unknown_key_message(path: str, names: Sequence[str]) -> str:
    """The error text for config key ``path`` (dotted, e.g. ``"train.micro_batch_sise"``), unknown among ``names``
    (its section's fields): the retired-name reason, else the nearest field."""
    if path in RETIRED_NAMES:
        return f"'{path}' is a Megatron-Bridge key this library does not take: {RETIRED_NAMES[path]}"
    prefix, _, key = path.rpartition(".")
    hint = difflib.get_close_matches(key, list(names), n=1)
    suggestion = f" (did you mean '{prefix + '.' if prefix else ''}{hint[0]}'?)" if hint else ""
    return f"unknown config key '{path}'{odd_characters(key)}{suggestion}"


def odd_characters(key: str) -> str:
    """Names the characters of ``key`` that are not ASCII (a look-alike letter such as Cyrillic 'а' pasted into a
    key reads like the right key), e.g. " (key 'trаin' contains U+0430 CYRILLIC SMALL LETTER A at character 3; ...)";
    "" if none."""
    import unicodedata

    odd = [(i, ch) for i, ch in enumerate(key, start=1) if not ch.isascii()]
    if not odd:
        return ""
    named = ", ".join(f"U+{ord(ch):04X} {unicodedata.name(ch, 'UNNAMED CHARACTER')} at character {i}"
                      for i, ch in odd[:3])
    more = f" and {len(odd) - 3} more" if len(odd) > 3 else ""
    return f" (key {key!r} contains {named}{more}; config keys are ASCII: retype it)"


@cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


@cache
def _settable_names(cls: type) -> frozenset[str]:
    """The fields of ``cls`` and its properties with a setter."""
    setters = {n for n in dir(cls) if isinstance(p := getattr(cls, n, None), property) and p.fset is not None}
    return _field_names(cls) | setters


def _dataclasses_in(tp: Any) -> list[type]:
    """The config dataclasses an annotation names (itself, or the members of a Union)."""
    if dataclasses.is_dataclass(tp):
        return [typing.cast(type, tp)]
    return [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]


_ROOTS: list[type] = []


def config_root(cls: T) -> T:
    """Class decorator of the config tree's root (``ConfigContainer``): errors name a section by its path from it."""
    _ROOTS.append(cls)
    section_paths.cache_clear()
    return cls


@cache
def section_paths() -> dict[type, str]:
    """Every config dataclass reachable from the root (:func:`config_root`) → its dotted path (``TrainingConfig`` →
    ``"train"``, ``FSDP2MixedPrecisionPolicy`` → ``"fsdp2.mp_policy"``; the first path where a class appears; the
    root itself → ``""``)."""
    paths: dict[type, str] = dict.fromkeys(_ROOTS, "")
    queue: list[type] = list(_ROOTS)
    while queue:
        cls = queue.pop(0)
        for name, tp in typing.get_type_hints(cls).items():
            for sub in _dataclasses_in(tp):
                if sub not in paths:
                    paths[sub] = f"{paths[cls]}.{name}".lstrip(".")
                    queue.append(sub)
    return paths


def _section_path(cls: type) -> str:
    paths = section_paths()
    return next((paths[c] for c in cls.__mro__ if c in paths), cls.__name__)


def _as_config_value(value: Any) -> Any:
    """A ``torch.dtype`` as its name (``torch.bfloat16`` → ``"bfloat16"``); any other value unchanged."""
    kind = type(value)
    if kind.__name__ == "dtype" and kind.__module__ == "torch":
        return str(value).removeprefix("torch.")
    return value


class DeclaredFields:
    """Base of every config dataclass: setting a name the dataclass does not declare is a named error (module
    docstring). Copies, pickling and ``dataclasses.replace`` set declared fields only, so they are unaffected."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and name not in _settable_names(type(self)):
            _refuse(self, name, value)
        object.__setattr__(self, name, _as_config_value(value))


def _refuse(obj: object, name: str, value: Any) -> None:
    cls = type(obj)
    section = _section_path(cls)
    path = f"{section}.{name}" if section else name
    if isinstance(getattr(cls, name, None), property):
        message = (f"cfg.{path} is computed from the fields (read-only): set the fields it is computed from "
                   f"(help({cls.__name__}.{name}))")
    else:
        message = (f"cfg.{path} = {value!r}: {unknown_key_message(path, sorted(_field_names(cls)))}; "
                   f"{cls.__name__} takes only its declared fields (docs/training/config-container.md)")
    raise ConfigValidationError(message, (path,))
