"""validate() reports every problem at once (each rule all its violations, every failing rule), and never divides or
allocates by a size before checking it: bad sizes and world sizes are named errors, never ZeroDivisionError or
OverflowError."""

import re

import pytest

from megatron_bridge.config.rules import _POSITIVE_FIELDS, INT64_MAX
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.recipes import tiny_llama_pretrain_config


def _set(cfg: object, path: str, value: object) -> None:
    *parents, leaf = path.split(".")
    for p in parents:
        cfg = getattr(cfg, p)
    setattr(cfg, leaf, value)


def _rules(exc: ConfigValidationError) -> list[str]:
    return re.findall(r"\[rule (\w+)\]", str(exc))


def test_every_violation_of_every_rule_is_listed() -> None:
    """The issue's command line: three rules fail, positive_sizes twice."""
    cfg = tiny_llama_pretrain_config()
    for path, value in (("train.micro_batch_size", 0), ("model.num_layers", -1), ("optimizer.lr", -1.0),
                        ("mixed_precision", None), ("optimizer.bf16", True), ("optimizer.fp16", True)):
        _set(cfg, path, value)
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=1)
    text = str(info.value)
    assert text.startswith("4 config problems:"), text
    assert sorted(_rules(info.value)) == ["nonnegative_values", "positive_sizes", "positive_sizes",
                                          "precision_exclusive"]
    assert "train.micro_batch_size must be > 0 (got 0)" in text and "model.num_layers must be > 0 (got -1)" in text
    assert {"train.micro_batch_size", "model.num_layers", "optimizer.lr", "optimizer.fp16"} <= set(info.value.paths)


def test_every_field_type_problem_is_its_own_line() -> None:
    cfg = tiny_llama_pretrain_config()
    cfg.train.micro_batch_size = "4"  # type: ignore[assignment]
    cfg.optimizer.lr = float("nan")
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=1)
    assert _rules(info.value) == ["field_types", "field_types"]
    assert {"train.micro_batch_size", "optimizer.lr"} <= set(info.value.paths)


@pytest.mark.parametrize("size", ["model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
                                  "model.context_parallel_size"])
def test_parallel_size_zero_is_named_not_a_zero_division(size: str) -> None:
    cfg = tiny_llama_pretrain_config()
    _set(cfg, size, 0)
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=2)
    assert _rules(info.value) == ["positive_sizes"]
    assert f"{size} must be > 0 (got 0)" in str(info.value) and info.value.paths == (size,)


@pytest.mark.parametrize("world_size", [0, -2, True, "2"])
def test_world_size_must_be_a_positive_int(world_size: object) -> None:
    with pytest.raises(ConfigValidationError, match=r"the world size must be an int >= 1 \(got .*\): it is the number "
                       r"of processes") as info:
        tiny_llama_pretrain_config().validate(world_size=world_size)  # type: ignore[arg-type]
    assert info.value.paths == ("world_size",)


@pytest.mark.parametrize(("path", "rule_id", "says"), [
    ("train.train_iters", "positive_sizes", "train.train_iters=100000000000000000000 is beyond 2147483647"),
    ("train.train_samples", "run_length_fits", "train.train_samples=100000000000000000000 reads"),
])
def test_huge_run_length_is_refused_before_anything_allocates(path: str, rule_id: str, says: str) -> None:
    cfg = tiny_llama_pretrain_config()
    cfg.train.train_iters = None
    _set(cfg, path, 10**20)
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=1)
    assert rule_id in _rules(info.value) and says in str(info.value)
    assert path in info.value.paths


def test_longest_run_that_fits_is_accepted() -> None:
    cfg = tiny_llama_pretrain_config()
    cfg.validation.eval_interval = None
    cfg.train.train_iters = None
    cfg.train.train_samples = INT64_MAX // (cfg.dataset.seq_length + 1) // cfg.train.global_batch_size * \
        cfg.train.global_batch_size
    cfg.validate(world_size=1)
    cfg.train.train_samples += cfg.train.global_batch_size
    with pytest.raises(ConfigValidationError, match=r"lower train.train_samples \[rule run_length_fits\]"):
        cfg.validate(world_size=1)


@pytest.mark.parametrize("value", [0, -1, 2**70])
@pytest.mark.parametrize("path", _POSITIVE_FIELDS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_no_size_crashes_validate(path: str, value: int, world_size: int) -> None:
    """Every size rule positive_sizes checks, bad or huge, under several world sizes: validate() accepts it or
    names problems; it never raises anything else (ZeroDivisionError, OverflowError, MemoryError)."""
    cfg = tiny_llama_pretrain_config(use_torch_fsdp2=True, tensor_model_parallel_size=2)
    cfg.fsdp2.tp_plan = {"layers.*.self_attn.q_proj": "colwise"}  # rule tp_plan_matches_model builds a meta model
    _set(cfg, path, value)
    try:
        cfg.validate(world_size=world_size)
    except ConfigValidationError as exc:
        assert _rules(exc), exc
        says = f"{path} must be > 0 (got {value})" if value <= 0 else f"{path}={value} is beyond"
        assert says in str(exc)
