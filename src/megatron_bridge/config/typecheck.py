"""Type-check every field of a config tree against its annotation (the ``field_types`` rule of ``validate()``).

YAML and ``key=value`` overrides are coerced and checked when they are read (:mod:`.serialization`); values assigned
from Python (``cfg.ddp.data_parallel_sharding_strategy = "zero3"``) are only seen here. The check never converts:

* ``bool`` fields take only ``True``/``False``; ``int`` fields take ints but not bools;
* ``float`` fields take ints and floats, but not bools, and never NaN or ±Inf (``lr: .nan`` in YAML is refused);
* ``Literal[...]`` fields take exactly one of the listed values, which the error names;
* ``list[X]`` / ``tuple[X, Y]`` / ``dict[K, V]`` / nested dataclasses are checked element by element (a tuple field
  takes a list of its length too: YAML has no tuples).
"""

import dataclasses
import math
import types
import typing
from functools import cache
from typing import Any, Literal, Union


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "None"
    origin = typing.get_origin(tp)
    if origin in (list, dict, tuple):
        return str(tp).replace("typing.", "")
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _describe(tp: Any) -> str:
    """Human-readable allowed values of an annotation, e.g. "int or None", "one of 'a', 'b'"."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        return " or ".join(_type_name(o) for o in typing.get_args(tp))
    return _type_name(tp)


def _scalar_ok(value: Any, tp: Any) -> bool:
    if tp is Any:
        return True
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if tp is type(None):
        return value is None
    if isinstance(tp, type):
        return isinstance(value, tp)
    return False


def _matches(value: Any, tp: Any) -> bool:
    """Whether ``value`` has the shape of ``tp`` at the top level (elements are checked by :func:`_problems`)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return any(_matches(value, option) for option in typing.get_args(tp))
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(tp))
    if origin is list:
        return isinstance(value, list)
    if origin is tuple:  # a fixed-length tuple; YAML gives a list of the same length
        return isinstance(value, tuple | list) and len(value) == len(typing.get_args(tp))
    if origin is dict:
        return isinstance(value, dict)
    if dataclasses.is_dataclass(tp):
        return isinstance(value, tp)  # type: ignore[arg-type]
    return _scalar_ok(value, tp)


def _chosen(value: Any, tp: Any) -> Any:
    """The member of a Union that ``value`` matches (exact kinds first), or ``tp`` itself."""
    if typing.get_origin(tp) not in (Union, types.UnionType):
        return tp
    options = sorted(typing.get_args(tp), key=lambda o: 0 if o in (type(None), bool) else 1)
    return next(o for o in options if _matches(value, o))


def _problems(value: Any, tp: Any, path: str) -> list[tuple[str, str]]:
    if not _matches(value, tp):
        return [(path, f"{path}={value!r} is not {_describe(tp)}")]
    if isinstance(value, float):
        if not math.isfinite(value):
            return [(path, f"{path}={value!r} must be a finite number (NaN and Inf are not allowed)")]
        return []
    tp = _chosen(value, tp)
    origin = typing.get_origin(tp)
    if origin is list:
        (item_tp,) = typing.get_args(tp) or (Any,)
        return [p for i, v in enumerate(value) for p in _problems(v, item_tp, f"{path}[{i}]")]
    if origin is tuple:
        return [p for i, (v, item_tp) in enumerate(zip(value, typing.get_args(tp), strict=True))
                for p in _problems(v, item_tp, f"{path}[{i}]")]
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp) or (Any, Any)
        return [p for k, v in value.items() for p in (*_problems(k, key_tp, f"{path} key {k!r}"),
                                                        *_problems(v, val_tp, f"{path}[{k!r}]"))]
    if dataclasses.is_dataclass(tp):
        return dataclass_problems(value, path)
    return []


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def dataclass_problems(obj: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(path, message) for every field of dataclass ``obj`` (recursively) whose value does not fit its annotation."""
    hints = _hints(type(obj))
    found: list[tuple[str, str]] = []
    for f in dataclasses.fields(obj):
        path = f"{prefix}.{f.name}" if prefix else f.name
        found.extend(_problems(getattr(obj, f.name), hints[f.name], path))
    return found
