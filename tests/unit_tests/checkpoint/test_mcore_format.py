"""Unit tests of the megatron-core engine's checkpoint pieces that need no process group: the config rule, the
safe reader (allow-lists, named errors for bad folders), Megatron-Bridge's train-state and scheduler formats, and
resolution of a Megatron-Bridge checkpoint root (tensor trackers, no manifest)."""

import argparse
import io
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from megatron_bridge.checkpoint import load as loading
from megatron_bridge.checkpoint import mcore_reader, mcore_state
from megatron_bridge.checkpoint.train_state import TrainState
from megatron_bridge.errors import CheckpointError, ConfigValidationError
from megatron_bridge.recipes import tiny_llama_pretrain_config


pytest.importorskip("megatron.core", reason="megatron-core engine (Python 3.12 environment)")


def _mcore_cfg():  # noqa: ANN202
    cfg = tiny_llama_pretrain_config(train_iters=10, global_batch_size=8, micro_batch_size=2)
    cfg.model.engine = "megatron_core"
    return cfg


# ------------------------------------------------------------------------------------------------------ config
def test_torch_dist_save_load_pass_the_megatron_core_rule() -> None:
    cfg = _mcore_cfg()
    cfg.checkpoint.save = cfg.checkpoint.load = "/tmp/ckpt"
    cfg.checkpoint.pretrained_checkpoint = "/tmp/pretrained"
    cfg.validate(world_size=2)
    cfg.checkpoint.async_save = True  # megatron-core's async dist_checkpointing.save (mcore_checkpoint.py)
    cfg.validate(world_size=2)


@pytest.mark.parametrize(("field", "value", "fix"), [("ckpt_format", "fsdp_dtensor", "'torch_dist'"),
                                                     ("ckpt_format", "torch", "'torch_dist'")])
def test_unsupported_checkpoint_settings_are_named(field: str, value: object, fix: str) -> None:
    cfg = _mcore_cfg()
    cfg.checkpoint.save = "/tmp/ckpt"
    setattr(cfg.checkpoint, field, value)
    with pytest.raises(ConfigValidationError, match=r"\[rule megatron_core_features\]") as info:
        cfg.validate(world_size=2)
    assert f"checkpoint.{field}" in info.value.paths and f"checkpoint.{field}={fix}" in str(info.value)


# ----------------------------------------------------------------------------------------------- safe reader
def _bytes(obj: object) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def test_safe_load_accepts_megatron_rng_state() -> None:
    state = [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
              "torch_rng_state": torch.get_rng_state()}]
    loaded = mcore_reader.safe_torch_load(_bytes(state), "rng")
    np.random.set_state(loaded[0]["np_rng_state"])
    random.setstate(loaded[0]["random_rng_state"])
    assert torch.equal(loaded[0]["torch_rng_state"], state[0]["torch_rng_state"])


def test_safe_load_reads_megatron_lm_args_but_not_code_inside() -> None:
    """megatron-core's import allow-lists argparse.Namespace for weights_only loads (Megatron-LM's ``args``); what
    a Namespace holds is still restricted."""
    loaded = mcore_reader.safe_torch_load(_bytes({"args": argparse.Namespace(lr=1.0)}), "common state")
    assert loaded["args"].lr == 1.0
    with pytest.raises(CheckpointError, match="not allowed"):
        mcore_reader.safe_torch_load(_bytes({"args": argparse.Namespace(hook=print)}), "common state")


def test_safe_load_refuses_code() -> None:
    with pytest.raises(CheckpointError, match="not allowed"):
        mcore_reader.safe_torch_load(_bytes({"f": print}), "object")


def test_check_mcore_folder_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="metadata.json"):
        mcore_reader.check_mcore_folder(tmp_path)
    (tmp_path / "metadata.json").write_text(json.dumps({"sharded_backend": "zarr"}))
    with pytest.raises(CheckpointError, match="'zarr'"):
        mcore_reader.check_mcore_folder(tmp_path)
    (tmp_path / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    with pytest.raises(CheckpointError, match=r"no DCP \.metadata"):
        mcore_reader.check_mcore_folder(tmp_path)
    (tmp_path / "metadata.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        mcore_reader.check_mcore_folder(tmp_path)


# ------------------------------------------------------------------------------------- Megatron-Bridge formats
def test_train_state_in_megatron_bridge_format_round_trips() -> None:
    state = TrainState(step=7, consumed_train_samples=56, floating_point_operations_so_far=1.5e9)
    saved = mcore_state.train_state_dict(state)
    assert set(saved) == {"step", "consumed_train_samples", "skipped_train_samples", "consumed_valid_samples",
                          "floating_point_operations_so_far", "do_train", "do_valid", "do_test"}
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in saved.values())
    restored = TrainState()
    restored.load_state_dict(torch.load(_bytes(saved), weights_only=True))
    assert restored == state


def test_scheduler_state_is_megatrons_in_samples_and_round_trips() -> None:
    cfg = _mcore_cfg()
    ours = {"num_steps": 3, "max_lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 2, "decay_steps": 10,
            "decay_style": "cosine", "start_wd": 0.1, "end_wd": 0.1}
    theirs = mcore_state.scheduler_to_megatron(ours, cfg)
    assert theirs["num_steps"] == 24 and theirs["lr_warmup_steps"] == 16 and theirs["lr_decay_steps"] == 80
    assert {"lr_decay_style", "wd_incr_steps", "wd_incr_style"} <= set(theirs) and "warmup_steps" not in theirs
    assert mcore_state.scheduler_from_megatron(theirs, cfg) == ours


def test_scheduler_from_megatron_names_a_changed_batch_size() -> None:
    cfg = _mcore_cfg()
    theirs = mcore_state.scheduler_to_megatron({"num_steps": 3, "max_lr": 1e-3, "min_lr": 0.0, "warmup_steps": 1,
                                                "decay_steps": 10, "decay_style": "linear", "start_wd": 0.0,
                                                "end_wd": 0.0}, cfg)
    cfg.train.global_batch_size = 16
    with pytest.raises(CheckpointError, match="global_batch_size"):
        mcore_state.scheduler_from_megatron(theirs, cfg)
    with pytest.raises(CheckpointError, match="load_optim=False"):
        mcore_state.scheduler_from_megatron({"num_steps": 8}, cfg)


def test_content_metadata_matches_megatron_bridge() -> None:
    cfg = _mcore_cfg()
    assert mcore_state.content_metadata(cfg) == {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    cfg.optimizer.use_distributed_optimizer = True
    assert mcore_state.content_metadata(cfg)["distrib_optim_sharding_type"] == "dp_reshardable"
    cfg.checkpoint.dist_ckpt_optim_fully_reshardable = True
    assert mcore_state.content_metadata(cfg)["distrib_optim_sharding_type"] == "fully_reshardable"


# -------------------------------------------------------------------------------------- Megatron-Bridge roots
def _megatron_bridge_root(root: Path, step: int) -> Path:
    """The files Megatron-Bridge leaves around an iteration folder (tensor train state, tracker without newline)."""
    folder = root / f"iter_{step:07d}"
    folder.mkdir(parents=True)
    torch.save(mcore_state.train_state_dict(TrainState(step=step)), root / "latest_train_state.pt")
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return folder


def test_tensor_tracker_of_megatron_bridge_resolves(tmp_path: Path) -> None:
    folder = _megatron_bridge_root(tmp_path, 20)
    assert loading.latest_step(tmp_path) == 20
    assert loading.resolve_folder(tmp_path, None) == folder


def test_megatron_bridge_folder_without_shards_is_a_named_error(tmp_path: Path) -> None:
    folder = _megatron_bridge_root(tmp_path, 5)
    (folder / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1}))
    with pytest.raises(CheckpointError, match=r"no DCP \.metadata"):
        loading.inspect_folder(folder, weights_only=False)


# ------------------------------------------------------------------------------------------------------ writer
def test_results_queue_manager_is_forked_and_stopped() -> None:
    """megatron-core's write-results queue is served by a forked manager (a spawned one re-imports torch), reused by
    later saves, and stopped by ``stop_writer_processes``."""
    import multiprocessing.context

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    from megatron_bridge.checkpoint.mcore_checkpoint import start_results_queue, stop_writer_processes

    assert filesystem_async._results_queue is None
    start_results_queue()
    queue = filesystem_async._results_queue
    process = queue._manager._process
    try:
        assert isinstance(process, multiprocessing.context.ForkProcess) and process.is_alive()
        start_results_queue()
        assert filesystem_async.get_write_results_queue() is queue  # what the writer asks for
        queue.put("written")
        assert queue.get(timeout=10) == "written"
    finally:
        stop_writer_processes()
    process.join(timeout=10)
    assert filesystem_async._results_queue is None and not process.is_alive()
