"""Pipeline parallelism on the megatron-core engine: rule ``megatron_core_pipeline`` (every refusal names its field
and the fix) and the adjustment ``megatron_core_vpp_p2p`` (batched P2P off with virtual stages, logged once)."""

import logging
from typing import Any

import pytest

from megatron_bridge.config import adjustments
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.recipes import tiny_llama_pretrain_config


pytest.importorskip("megatron.core", reason="the megatron-core engine needs megatron-core (Python 3.12)")


@pytest.fixture(autouse=True)
def _fresh_log_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adjustments, "_LOGGED", set())


def mcore_pp(vp: int | None = None, **model: Any) -> ConfigContainer:
    """tiny_llama on the megatron-core engine at PP=2 (16 samples in micro-batches of 1 per step)."""
    cfg = tiny_llama_pretrain_config(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=vp)
    cfg.model.engine = "megatron_core"
    for name, value in model.items():
        setattr(cfg.model, name, value)
    return cfg


@pytest.mark.parametrize(("vp", "model", "path", "fix"), [
    (2, {"pipeline_schedule": "InterleavedZeroBubble"}, "model.pipeline_schedule", "model.pipeline_schedule=None"),
    (2, {"pipeline_schedule": "DualPipeV"}, "model.pipeline_schedule", "model.engine='native'"),
    (None, {"overlap_p2p_comm": True}, "model.overlap_p2p_comm", "model.overlap_p2p_comm=False"),
    (None, {"pipeline_dtype": "bfloat16"}, "model.pipeline_dtype", "model.pipeline_dtype=None"),
    (2, {"num_layers_in_first_pipeline_stage": 2, "num_layers_in_last_pipeline_stage": 2},
     "model.num_layers_in_first_pipeline_stage", "model.num_layers_in_last_pipeline_stage=None"),
])
def test_refusals_name_field_value_and_fix(vp: int | None, model: dict[str, Any], path: str, fix: str) -> None:
    cfg = mcore_pp(vp, **model)
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=2)
    message = str(info.value)
    assert "[rule megatron_core_pipeline]" in message and path in info.value.paths, message
    assert f"{path}={model[path.split('.')[1]]!r}" in message and fix in message, message


def test_overlap_with_batched_p2p_is_refused() -> None:
    """finalize() turns batch_p2p_comm off only with virtual stages; a config reaching the rule with both on (built
    without finalize's adjustment, e.g. PP without VP is refused first) names both fields."""
    from megatron_bridge.config.rule_set import check_rules

    cfg = mcore_pp(2, overlap_p2p_comm=True)
    with pytest.raises(ConfigValidationError, match=r"model.batch_p2p_comm=False") as info:
        check_rules(cfg, 2, only=("megatron_core_pipeline",))  # no finalize(): batch_p2p_comm still True
    assert "model.batch_p2p_comm" in info.value.paths


@pytest.mark.parametrize(("global_batch_size", "world_size", "ok"), [(16, 2, True), (3, 2, False), (2, 4, False),
                                                                     (4, 4, True)])
def test_interleaved_micro_batches_in_groups_of_pp(global_batch_size: int, world_size: int, ok: bool) -> None:
    """megatron-core's interleaved schedule runs the micro-batches in groups of PP: their count is a positive
    multiple of PP (world 4 = PP 2 × DP 2: global batch 2 is one micro-batch per rank)."""
    cfg = mcore_pp(2)
    cfg.train.global_batch_size, cfg.train.micro_batch_size = global_batch_size, 1
    if ok:
        cfg.validate(world_size=world_size)
        return
    with pytest.raises(ConfigValidationError, match=r"must be a multiple of 2; set e.g. train.global_batch_size=(2|4)"
                       r" \[rule megatron_core_pipeline\]"):
        cfg.validate(world_size=world_size)


def test_megatron_core_schedules_and_uneven_splits_pass() -> None:
    for cfg in (mcore_pp(None, pipeline_schedule="1F1B", num_layers_in_first_pipeline_stage=1),
                mcore_pp(2, pipeline_schedule="Interleaved1F1B", overlap_p2p_comm=True),
                mcore_pp(None, account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True,
                         pipeline_dtype="float32")):
        cfg.validate(world_size=2)


def test_tied_embeddings_under_pp() -> None:
    """Both engines keep a copy of a tied embedding on the last stage; the native engine refuses it with the V
    schedules (first and last stage on one rank)."""
    mcore_pp(2, share_embeddings_and_output_weights=True).validate(world_size=2)
    native = tiny_llama_pretrain_config(pipeline_model_parallel_size=2)
    native.model.share_embeddings_and_output_weights = True
    native.validate(world_size=2)
    v_shape = tiny_llama_pretrain_config(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2)
    v_shape.model.share_embeddings_and_output_weights = True
    v_shape.model.pipeline_schedule = "DualPipeV"
    with pytest.raises(ConfigValidationError, match=r"model.engine='megatron_core'.*\[rule pipeline_tied_embeddings\]"):
        v_shape.validate(world_size=2)


def test_native_engine_keeps_its_schedules() -> None:
    """The rule and the adjustment concern the megatron-core engine only."""
    cfg = tiny_llama_pretrain_config(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2)
    cfg.model.pipeline_schedule = "ZBVZeroBubble"
    cfg.validate(world_size=2)
    assert cfg.model.batch_p2p_comm is True


def test_virtual_stages_turn_batched_p2p_off_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="megatron_bridge"):
        for _ in range(2):
            cfg = mcore_pp(2)
            cfg.validate(world_size=2)
            assert cfg.model.batch_p2p_comm is False
    logged = [r.getMessage() for r in caplog.records if "model.batch_p2p_comm=False" in r.getMessage()]
    assert len(logged) == 1 and "NVIDIA/Megatron-LM#750" in logged[0], logged


def test_batched_p2p_kept_without_virtual_stages() -> None:
    """megatron-core's 1F1B schedule is correct with batched P2P: nothing changes."""
    cfg = mcore_pp(None)
    cfg.validate(world_size=2)
    assert cfg.model.batch_p2p_comm is True
