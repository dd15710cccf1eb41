"""The documented adjustments of finalize(): each one happens, is logged once, and nothing else changes."""

import logging

import pytest

from megatron_bridge.config import adjustments
from megatron_bridge.config.mixed_precision import MixedPrecisionConfig
from megatron_bridge.recipes import tiny_llama_pretrain_config
from megatron_bridge.recipes.perf import megatron_fsdp_overrides


@pytest.fixture(autouse=True)
def _fresh_log_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adjustments, "_LOGGED", set())
    from megatron_bridge.utils import logging as mb_logging

    monkeypatch.setattr(mb_logging, "_WARNED_ONCE", set())


def test_mixed_precision_preset_resolved_and_copied() -> None:
    cfg = tiny_llama_pretrain_config(mixed_precision="bf16_mixed")
    cfg.finalize()
    assert isinstance(cfg.mixed_precision, MixedPrecisionConfig)
    assert cfg.optimizer.bf16 and not cfg.optimizer.fp16
    assert cfg.ddp.grad_reduce_in_fp32 is True
    assert cfg.model.params_dtype == "float32"


def test_unknown_preset_is_named() -> None:
    cfg = tiny_llama_pretrain_config(mixed_precision="bf17")
    with pytest.raises(ValueError, match="mixed_precision='bf17'.*bf16_mixed"):
        cfg.validate(world_size=1)


def test_megatron_fsdp_flags_synced_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    cfg = tiny_llama_pretrain_config()
    cfg.ddp.use_megatron_fsdp = True
    with caplog.at_level(logging.WARNING, logger="megatron_bridge"):
        cfg.finalize()
        cfg.finalize()
    assert cfg.dist.use_megatron_fsdp and cfg.ddp.use_megatron_fsdp
    assert cfg.optimizer.use_distributed_optimizer and cfg.ddp.use_distributed_optimizer
    messages = [r.getMessage() for r in caplog.records if "dist.use_megatron_fsdp" in r.getMessage()]
    assert len(messages) == 1


def test_legacy_nan_check_warns_once_and_keeps_value(caplog: pytest.LogCaptureFixture) -> None:
    cfg = megatron_fsdp_overrides(tiny_llama_pretrain_config())
    cfg.ddp.check_for_nan_in_grad = True
    with caplog.at_level(logging.WARNING, logger="megatron_bridge"):
        cfg.validate(world_size=2)
        cfg.validate(world_size=2)
    warnings = [r for r in caplog.records if "report_nan_in_param_grad" in r.getMessage()]
    assert len(warnings) == 1
    assert cfg.ddp.check_for_nan_in_grad is True


def test_no_legacy_warning_without_megatron_fsdp(caplog: pytest.LogCaptureFixture) -> None:
    cfg = tiny_llama_pretrain_config()
    cfg.ddp.check_for_nan_in_grad = True
    with caplog.at_level(logging.WARNING, logger="megatron_bridge"):
        cfg.validate(world_size=1)
    assert not [r for r in caplog.records if "report_nan_in_param_grad" in r.getMessage()]


def test_async_tp_turns_on_sequence_parallel(caplog: pytest.LogCaptureFixture) -> None:
    cfg = tiny_llama_pretrain_config(tensor_model_parallel_size=2, global_batch_size=16)
    cfg.dist.use_torch_fsdp2 = True
    cfg.fsdp2.enable_async_tensor_parallel = True
    cfg.fsdp2.enable_compile = True
    with caplog.at_level(logging.WARNING, logger="megatron_bridge"):
        cfg.validate(world_size=2)
    assert cfg.model.sequence_parallel is True
    assert any("model.sequence_parallel" in r.getMessage() for r in caplog.records)


def test_finalize_does_not_touch_unrelated_fields() -> None:
    cfg = tiny_llama_pretrain_config()
    before = _flatten(cfg.to_dict())
    cfg.finalize()
    after = _flatten(cfg.to_dict())
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    # the preset name became its resolved config, and the preset's fp32 gradient reduction was copied to ddp
    assert {k for k in changed if not k.startswith("mixed_precision")} == {"ddp.grad_reduce_in_fp32"}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_warmup_longer_than_decay_is_capped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    """Megatron-Bridge caps warmup to decay - 1 with a warning: llama3_8b (2000 warmup steps) with 100 steps runs."""
    from megatron_bridge.recipes import llama3_8b_pretrain_config

    cfg = llama3_8b_pretrain_config(train_iters=100)
    with caplog.at_level(logging.WARNING, logger="megatron_bridge"):
        cfg.validate(world_size=2)
    assert cfg.scheduler.lr_warmup_iters == 99 and cfg.lr_warmup_iters == 99
    assert [r for r in caplog.records if "scheduler.lr_warmup_iters=99 (was 2000)" in r.getMessage()]
    cfg.scheduler.lr_decay_iters = 50  # an explicit decay length caps too
    cfg.validate(world_size=2)
    assert cfg.scheduler.lr_warmup_iters == 49


def test_warmup_shorter_than_decay_is_untouched() -> None:
    cfg = tiny_llama_pretrain_config(train_iters=100, lr_warmup_iters=99)
    cfg.validate(world_size=1)
    assert cfg.scheduler.lr_warmup_iters == 99


def test_megatron_fsdp_average_in_collective_is_set_false(caplog: pytest.LogCaptureFixture) -> None:
    cfg = tiny_llama_pretrain_config()
    cfg.dist.use_megatron_fsdp = True
    cfg.ddp.average_in_collective = True
    with caplog.at_level(logging.WARNING, logger="megatron_bridge"):
        cfg.validate(world_size=1)
    assert cfg.ddp.average_in_collective is False
    assert [r for r in caplog.records if "ddp.average_in_collective=False (was True)" in r.getMessage()]
    ddp_cfg = tiny_llama_pretrain_config()
    ddp_cfg.ddp.average_in_collective = True  # DDP keeps it (it means the same there)
    assert ddp_cfg.validate(world_size=1).ddp.average_in_collective is True
