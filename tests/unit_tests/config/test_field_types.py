"""The field_types rule: every field, set from Python or YAML, is checked against its annotation by validate()."""

import dataclasses
import math
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal, Union

import pytest

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.recipes import tiny_llama_pretrain_config


def _fields(cls: type, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, annotation) of every field of ``cls``, descending into nested config dataclasses."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, path = hints[f.name], f"{prefix}{f.name}"
        yield path, tp
        if dataclasses.is_dataclass(tp):
            yield from _fields(tp, f"{path}.")


def _options(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp) if typing.get_origin(tp) in (Union, types.UnionType) else (tp,)


def _literal_values(tp: Any) -> tuple[Any, ...] | None:
    for option in _options(tp):
        if typing.get_origin(option) is Literal:
            return typing.get_args(option)
    return None


def _set(cfg: ConfigContainer, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    obj: Any = cfg
    for p in parents:
        obj = getattr(obj, p)
    setattr(obj, leaf, value)


def _config_with_subsections() -> ConfigContainer:
    """The tiny recipe with the optional sub-configs present, so their fields are reachable too."""
    from megatron_bridge.config.distributed import FSDP2MixedPrecisionPolicy, FSDP2OffloadPolicy

    cfg = tiny_llama_pretrain_config()
    cfg.fsdp2.mp_policy = FSDP2MixedPrecisionPolicy()
    cfg.fsdp2.offload_policy = FSDP2OffloadPolicy()
    return cfg


LITERAL_FIELDS = [(path, tp) for path, tp in _fields(ConfigContainer) if _literal_values(tp)]
FLOAT_FIELDS = [path for path, tp in _fields(ConfigContainer) if float in _options(tp)]


def test_the_tree_has_literal_and_float_fields() -> None:
    assert len(LITERAL_FIELDS) >= 15 and "ddp.data_parallel_sharding_strategy" in dict(LITERAL_FIELDS)
    assert len(FLOAT_FIELDS) >= 15 and "optimizer.lr" in FLOAT_FIELDS and "optimizer.clip_grad" in FLOAT_FIELDS


@pytest.mark.parametrize("path,tp", LITERAL_FIELDS, ids=[p for p, _ in LITERAL_FIELDS])
def test_every_bad_literal_set_from_python_is_named(path: str, tp: Any) -> None:
    cfg = _config_with_subsections()
    _set(cfg, path, "not-a-choice")
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=1)
    message = str(info.value)
    assert path in info.value.paths and f"{path}='not-a-choice'" in message and "[rule field_types]" in message
    for allowed in _literal_values(tp):
        assert repr(allowed) in message, (allowed, message)


@pytest.mark.parametrize("path", FLOAT_FIELDS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_every_float_field_refuses_nan_and_inf(path: str, bad: float) -> None:
    cfg = _config_with_subsections()
    _set(cfg, path, bad)
    with pytest.raises(ConfigValidationError, match="finite") as info:
        cfg.validate(world_size=1)
    assert path in info.value.paths


@pytest.mark.parametrize("override", ["optimizer.lr=.nan", "optimizer.clip_grad=.nan", "optimizer.lr=.inf"])
def test_nan_from_yaml_overrides_is_refused(override: str) -> None:
    cfg = tiny_llama_pretrain_config().apply_overrides(overrides=[override])
    with pytest.raises(ConfigValidationError, match=r"must be a finite number.*\[rule field_types\]"):
        cfg.validate(world_size=1)


def test_nan_from_a_yaml_file_is_refused(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("optimizer:\n  lr: .nan\n")
    with pytest.raises(ConfigValidationError, match="optimizer.lr=nan"):
        tiny_llama_pretrain_config().apply_overrides(path).validate(world_size=1)


@pytest.mark.parametrize("path,value", [
    ("model.num_layers", "4"), ("model.num_layers", 4.0), ("model.num_layers", True),
    ("dataset.mock", 1), ("optimizer.lr", "1e-3"), ("optimizer.lr", True), ("dataset.data_path", "a"),
    ("dataset.data_path", [1]), ("fsdp2.tp_plan", {"x": 1}), ("ddp.activation_checkpointing", "partial"),
    ("fsdp2.mp_policy", "bf16"), ("train.train_iters", 10.5),
])
def test_wrong_kinds_are_named(path: str, value: Any) -> None:
    cfg = tiny_llama_pretrain_config()
    _set(cfg, path, value)
    with pytest.raises(ConfigValidationError, match=r"\[rule field_types\]") as info:
        cfg.validate(world_size=1)
    assert any(p == path or p.startswith(f"{path}[") or p.startswith(f"{path} ") for p in info.value.paths)


def test_ints_are_floats_and_unions_accept_each_member() -> None:
    cfg = tiny_llama_pretrain_config()
    cfg.optimizer.lr = 1  # an int is a valid float (PEP 484)
    cfg.ddp.activation_checkpointing = "selective"
    cfg.fsdp2.tp_plan = {"layers.*.mlp.up_proj": "colwise"}
    cfg.train.exit_duration_in_mins = 5
    cfg.validate(world_size=1)


def test_every_type_problem_is_reported_together() -> None:
    cfg = tiny_llama_pretrain_config()
    cfg.optimizer.lr = math.nan
    cfg.model.normalization = "BatchNorm"
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=1)
    assert {"optimizer.lr", "model.normalization"} <= set(info.value.paths)
