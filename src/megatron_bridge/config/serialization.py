"""YAML round trip and ``a.b=c`` overrides of config dataclasses, with strict key and type checking.

Files and overrides are untrusted input: YAML is read with the safe loader (a key repeated in one mapping is refused,
``${...}`` interpolations in overrides too), nothing is instantiated from a string
except the allow-listed ``_target_`` names below (the seed's FSDP2 ``mp_policy`` form), and an unknown key or a value
of the wrong type is a :class:`~megatron_bridge.errors.ConfigOverrideError` naming the dotted key.
"""

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

from megatron_bridge.config.declared import unknown_key_message
from megatron_bridge.errors import ConfigOverrideError


T = TypeVar("T")

# `_target_` values accepted in YAML, and the config dataclass each one maps to (by field, see _ALLOWED_TARGETS use).
ALLOWED_TARGETS: dict[str, str] = {
    "torch.distributed.fsdp.MixedPrecisionPolicy": "FSDP2MixedPrecisionPolicy",
    "torch.distributed.fsdp.CPUOffloadPolicy": "FSDP2OffloadPolicy",
    "megatron_bridge.config.distributed.FSDP2MixedPrecisionPolicy": "FSDP2MixedPrecisionPolicy",
    "megatron_bridge.config.distributed.FSDP2OffloadPolicy": "FSDP2OffloadPolicy",
}


def to_dict(obj: Any) -> Any:
    """Dataclasses → plain dicts (recursively), keeping only YAML-safe values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    return obj


_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
"""libyaml's safe emitter where PyYAML has it (the same text as the pure-Python ``SafeDumper``, for every shipped
recipe: tests/unit_tests/config/test_serialization.py; ≈ 5x faster, and every run computes the config digest and writes
its YAML more than once)."""


def to_yaml(obj: Any, path: str | Path | None = None) -> str:
    """YAML text of a config dataclass; written to ``path`` when given."""
    text = yaml.dump(to_dict(obj), Dumper=_DUMPER, sort_keys=False, default_flow_style=False)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    return text


def config_digest(obj: Any) -> str:
    """SHA-256 (hex) of ``obj``'s YAML (what ``--dry-run`` prints): equal configs, equal digests."""
    import hashlib

    return hashlib.sha256(to_yaml(obj).encode()).hexdigest()


def from_yaml(cls: type[T], path: str | Path) -> T:
    """Build ``cls`` from a YAML file (safe loader; Megatron-Bridge's moved keys are moved:
    :mod:`megatron_bridge.config.deprecated`)."""
    from megatron_bridge.config.deprecated import move_deprecated_keys

    return from_dict(cls, move_deprecated_keys(_load_yaml_mapping(path)))


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with the same key twice (safe_load keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigOverrideError(
                    f"{self.name}: key {key!r} appears twice in one mapping (lines {seen[key]} and {line}); the "
                    "first value would be silently ignored: keep one of them")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


MAX_YAML_DEPTH = 64
"""Deepest nesting of mappings/lists a config YAML may have (configs nest 4 deep; the loader recurses per level)."""


def _check_depth(text: str, name: str) -> None:
    """ConfigOverrideError when ``text`` nests deeper than :data:`MAX_YAML_DEPTH` (checked on the event stream,
    which is not recursive, before the recursive composer would overflow the stack)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                mark = event.start_mark
                where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
                raise ConfigOverrideError(f"YAML {name} nests mappings/lists more than {MAX_YAML_DEPTH} deep{where}; a "
                                          "config nests at most a few levels: fix the file")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def load_yaml_text(text: str, name: str = "<string>") -> Any:
    """YAML text as plain data with the safe loader; a key repeated in one mapping, or nesting deeper than
    :data:`MAX_YAML_DEPTH`, is a ConfigOverrideError."""
    _check_depth(text, name)
    loader = _UniqueKeyLoader(text)
    loader.name = name
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()  # type: ignore[no-untyped-call]


def _load_yaml_mapping(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        from megatron_bridge.utils.paths import describe_path

        what = describe_path(path)
        if what == "missing":
            raise ConfigOverrideError(f"config file {str(path)!r} does not exist")
        raise ConfigOverrideError(f"config file {str(path)!r} cannot be read: it is {what}, not a YAML file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigOverrideError(f"config file {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigOverrideError(
            f"config file {str(path)!r} is not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line}, column "
            f"{column} ({raw[max(0, exc.start - 12):exc.start + 4]!r}); save the file as UTF-8") from None
    try:
        data = load_yaml_text(text, repr(str(path)))
    except yaml.YAMLError as exc:
        raise ConfigOverrideError(f"config file {str(path)!r} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigOverrideError(
            f"config file {str(path)!r} must hold a mapping at the top (got {type(data).__name__})"
        )
    return data


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; missing keys keep their defaults, unknown keys and bad types raise."""
    if not isinstance(data, dict):
        raise ConfigOverrideError(f"{prefix or 'config'} must be a mapping (got {data!r})")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key == "_target_":
            _check_target(value, cls, path)
            continue
        if key not in names:
            raise ConfigOverrideError(unknown_key_message(path, names))
        kwargs[key] = _coerce(value, hints[key], path)
    return cls(**kwargs)




def _check_target(value: Any, cls: type, path: str) -> None:
    if ALLOWED_TARGETS.get(str(value)) != cls.__name__:
        allowed = sorted(k for k, v in ALLOWED_TARGETS.items() if v == cls.__name__)
        raise ConfigOverrideError(
            f"'{path}': {value!r} is not an allowed target here; allowed: {allowed or 'none'} "
            "(config files never instantiate arbitrary classes)"
        )


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Check ``value`` against annotation ``tp`` (converting ints to floats and dicts to dataclasses)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        mapping_error: ConfigOverrideError | None = None
        # Try exact kinds first so that `bool | Literal[...]` keeps a bool and `X | str` keeps a str.
        for option in sorted(options, key=lambda o: 0 if o is type(None) or o is bool else 1):
            try:
                return _coerce(value, option, path)
            except ConfigOverrideError as exc:
                if isinstance(value, dict) and dataclasses.is_dataclass(option):
                    mapping_error = exc
        if mapping_error is not None:  # a mapping meant for a sub-config: its own error names the bad key
            raise mapping_error
        raise ConfigOverrideError(
            f"'{path}' must be {' or '.join(_type_name(o) for o in options)} (got {value!r})"
        )
    if tp is type(None):
        if value is None:
            return None
        raise ConfigOverrideError(f"'{path}' must be null (got {value!r})")
    if value is None:
        raise ConfigOverrideError(f"'{path}' must not be null (expected {_type_name(tp)})")
    if origin is Literal:
        if value in typing.get_args(tp) and type(value) in {type(a) for a in typing.get_args(tp)}:
            return value
        raise ConfigOverrideError(f"'{path}' must be one of {list(typing.get_args(tp))} (got {value!r})")
    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value):
            return value
        return from_dict(tp, value, prefix=f"{path}.")
    if origin is list:
        if not isinstance(value, list | tuple):
            raise ConfigOverrideError(f"'{path}' must be a list (got {value!r})")
        (item_tp,) = typing.get_args(tp) or (Any,)
        if item_tp is str:  # YAML and `a=[0.7,x]` overrides parse a blend's weights as numbers
            value = [_number_as_str(v) for v in value]
        return [_coerce(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:  # YAML has no tuples: a list of the tuple's length
        items = typing.get_args(tp)
        if not isinstance(value, list | tuple) or len(value) != len(items):
            raise ConfigOverrideError(f"'{path}' must be a list of {len(items)} (got {value!r})")
        return tuple(_coerce(v, item_tp, f"{path}[{i}]") for i, (v, item_tp) in enumerate(zip(value, items)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigOverrideError(f"'{path}' must be a mapping (got {value!r})")
        key_tp, val_tp = typing.get_args(tp) or (Any, Any)
        return {_coerce(k, key_tp, f"{path}.{k}"): _coerce(v, val_tp, f"{path}.{k}") for k, v in value.items()}
    return _coerce_scalar(value, tp, path)


def _number_as_str(value: Any) -> Any:
    """A number inside a list of strings as its text (``dataset.data_path=[0.7,a,0.3,b]``: the documented blend
    syntax); anything else unchanged."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value) if isinstance(value, float) else str(value)
    return value


def _coerce_scalar(value: Any, tp: Any, path: str) -> Any:
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise ConfigOverrideError(f"'{path}' has an unsupported config type {tp!r}")
    raise ConfigOverrideError(f"'{path}' must be {_type_name(tp)} (got {value!r})")


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Parse Hydra-style ``a.b=c`` strings with OmegaConf (YAML scalars: ``true``, ``10``, ``null``, ``[a,b]``)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigOverrideError(f"override {item!r} must look like 'section.key=value'")
        if item.startswith(("+", "~")):
            raise ConfigOverrideError(f"override {item!r}: adding or deleting keys is not supported; set existing keys")
        if "${" in item.partition("=")[2]:
            raise ConfigOverrideError(
                f"override {item!r}: ${{...}} interpolations are not supported (they would resolve against the other "
                "overrides or the environment only, never the recipe); write the value itself")
    try:
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist(list(overrides)), resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigOverrideError(f"could not parse overrides {overrides}: {exc}") from exc
    return typing.cast(dict[str, Any], parsed)


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Recursive merge: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_overrides(cfg: T, yaml_path: str | Path | None, overrides: list[str]) -> T:
    """A new config built from ``cfg`` < the YAML file < the ``key=value`` overrides.

    A ``key=value`` override of a field the ``mixed_precision`` preset sets (``optimizer.bf16``, ...) to another
    value than the preset's is a ConfigOverrideError: ``finalize()`` would silently replace it.
    """
    from megatron_bridge.config.deprecated import move_deprecated_keys

    data = to_dict(cfg)
    if yaml_path is not None:
        data = merge(data, move_deprecated_keys(_load_yaml_mapping(yaml_path)))
    cli = move_deprecated_keys(parse_overrides(overrides)) if overrides else {}
    data = merge(data, cli)
    out = from_dict(type(cfg), data)
    if cli and hasattr(out, "mixed_precision"):
        _check_preset_overrides(out, cli)
    return out


def _flat_keys(data: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for key, value in data.items():
        path = f"{prefix}{key}"
        keys |= _flat_keys(value, f"{path}.") if isinstance(value, dict) else {path}
    return keys


def _check_preset_overrides(cfg: Any, cli: dict[str, Any]) -> None:
    from megatron_bridge.config.adjustments import preset_conflicts

    conflicts = preset_conflicts(cfg, _flat_keys(cli))
    if conflicts:
        raise ConfigOverrideError(
            "; ".join(conflicts) + ". Set mixed_precision=null to choose these fields yourself, or pick the preset "
            "that sets them (bf16_mixed, fp16_mixed, fp32)"
        )
