"""DDP backend: every cfg.ddp option reaches torch's DistributedDataParallel (world size 1, gloo)."""

import warnings

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.nn.parallel import DistributedDataParallel

from megatron_bridge.distributed.ddp import DDPBackend
from megatron_bridge.engines.ddp_wrap import ddp_wrap
from megatron_bridge.errors import ConfigValidationError, TrainingError
from tests.unit_tests.distributed.helpers import batch, build, count_modules, full_state, tiny_cfg


CPU = torch.device("cpu")


def _wrap(cfg) -> DDPBackend:  # noqa: ANN001
    backend = ddp_wrap(build(cfg), cfg, CPU)
    assert isinstance(backend, DDPBackend)
    return backend


def test_defaults_reach_ddp_without_deprecation_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        backend = _wrap(tiny_cfg())
    ddp = backend.chunks[0]
    assert isinstance(ddp, DistributedDataParallel)
    assert ddp.broadcast_buffers is False
    assert ddp.bucket_bytes_cap == 25 * 1024 * 1024  # bucket_cap_mb=None: torch's default
    assert (ddp.find_unused_parameters, ddp.gradient_as_bucket_view, ddp.static_graph) == (False, False, False)


@pytest.mark.parametrize(("option", "value", "attribute", "expected"), [
    ("broadcast_buffers", True, "broadcast_buffers", True),
    ("bucket_cap_mb", 2.0, "bucket_bytes_cap", 2 * 1024 * 1024),
    ("find_unused_parameters", True, "find_unused_parameters", True),
    ("gradient_as_bucket_view", True, "gradient_as_bucket_view", True),
    ("static_graph", True, "static_graph", True),
])
def test_each_option_reaches_ddp(option: str, value: object, attribute: str, expected: object) -> None:
    cfg = tiny_cfg()
    setattr(cfg.ddp, option, value)
    assert getattr(_wrap(cfg).chunks[0], attribute) == expected


def test_no_sync_until_the_last_microbatch() -> None:
    backend = _wrap(tiny_cfg())
    ddp = backend.chunks[0]
    with backend.grad_sync_context(is_last_microbatch=False):
        assert ddp.require_backward_grad_sync is False
    assert ddp.require_backward_grad_sync is True
    with backend.grad_sync_context(is_last_microbatch=True):
        assert ddp.require_backward_grad_sync is True


@pytest.mark.parametrize(("mode", "scope", "wrapped"), [(True, ["all"], 3), ("selective", ["language"], 3),
                                                        ("full", ["vision"], 0)])
def test_activation_checkpointing(mode: object, scope: list[str], wrapped: int) -> None:
    cfg = tiny_cfg()
    cfg.ddp.activation_checkpointing, cfg.ddp.activation_checkpointing_scope = mode, scope
    backend = _wrap(cfg)
    assert count_modules(backend.chunks[0], CheckpointWrapper) == wrapped
    keys = set(backend.model_state_dict()["model"])
    assert keys == set(build(tiny_cfg())[0].state_dict())  # no "module." / wrapper prefixes


def _autocast_dtype_in_forward(backend: DDPBackend) -> torch.dtype | None:
    with backend.forward_context():
        return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None


@pytest.mark.parametrize(("autocast", "preset", "expected"), [
    (None, None, None), ("bfloat16", None, torch.bfloat16), (None, "bf16_mixed", torch.bfloat16),
    (None, "fp32", None), ("float16", None, torch.float16), (None, "fp16_mixed", torch.float16),
])
def test_autocast(autocast: str | None, preset: str | None, expected: torch.dtype | None) -> None:
    cfg = tiny_cfg()
    cfg.ddp.autocast_dtype, cfg.mixed_precision = autocast, preset
    cfg.finalize()
    backend = _wrap(cfg)
    assert _autocast_dtype_in_forward(backend) == expected
    with backend.forward_context():
        loss = backend.chunks[0](batch(), labels=batch()).mean()
    assert torch.isfinite(loss)


def test_float32_autocast_is_rejected() -> None:
    cfg = tiny_cfg()
    cfg.ddp.autocast_dtype = "float32"
    with pytest.raises(ConfigValidationError, match="ddp.autocast_dtype='float32'"):
        DDPBackend(cfg, CPU)


@pytest.mark.parametrize("check", [True, False])
def test_nan_gradient_norm(check: bool) -> None:
    cfg = tiny_cfg()
    cfg.ddp.check_for_nan_in_grad = check
    backend = _wrap(cfg)
    backend.chunks[0](batch(), labels=batch()).mean().backward()
    assert torch.isfinite(backend.clip_grad_norm(1.0))
    next(backend.chunks[0].parameters()).grad[0] = float("nan")
    if check:
        with pytest.raises(TrainingError, match="ddp.check_for_nan_in_grad"):
            backend.clip_grad_norm(1.0)
    else:
        assert torch.isnan(backend.clip_grad_norm(1.0))


def test_meta_device_build_is_materialized_like_a_direct_build() -> None:
    direct = build(tiny_cfg(), seed=3)[0].state_dict()
    cfg = tiny_cfg(init_model_with_meta_device=True)
    chunks = build(cfg, seed=3)
    assert next(chunks[0].parameters()).is_meta
    state = full_state(ddp_wrap(chunks, cfg, CPU).model_state_dict()["model"])
    assert state.keys() == direct.keys()
    for key, value in direct.items():
        assert torch.equal(state[key], value), key
