"""Megatron FSDP checkpoints of the megatron-core engine (``fsdp_dtensor``) without a process group: the config rules
(which format, which sharding strategy), the safe reader of their DCP values, recognition of a Megatron-Bridge
fsdp_dtensor folder (no manifest, no megatron-core metadata.json), and the named error for a checkpoint of the other
wrapper. Saving and bit-exact resume run in tests/functional_tests/mcore/test_wrappers.py."""

import io
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from megatron_bridge.errors import CheckpointError, ConfigValidationError
from megatron_bridge.recipes import tiny_llama_pretrain_config


pytest.importorskip("megatron.core", reason="megatron-core engine (Python 3.12 environment)")

from megatron_bridge.checkpoint import load as loading  # noqa: E402
from megatron_bridge.checkpoint import mcore_megatron_fsdp, mcore_reader  # noqa: E402
from megatron_bridge.checkpoint.manager import CheckpointManager  # noqa: E402


def _mfsdp_cfg(strategy: str = "optim_grads_params"):  # noqa: ANN202
    cfg = tiny_llama_pretrain_config(train_iters=10, global_batch_size=8, micro_batch_size=2)
    cfg.model.engine = "megatron_core"
    cfg.dist.use_megatron_fsdp = True
    cfg.ddp.data_parallel_sharding_strategy = strategy
    cfg.checkpoint.ckpt_format = "fsdp_dtensor"
    cfg.checkpoint.save = cfg.checkpoint.load = "/tmp/mb-never-written"
    return cfg


# ------------------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("strategy", ["optim", "optim_grads", "optim_grads_params"])
def test_fsdp_dtensor_save_and_load_pass_validation(strategy: str) -> None:
    _mfsdp_cfg(strategy).validate(world_size=2)


def test_torch_dist_with_megatron_fsdp_is_refused_with_the_reason() -> None:
    cfg = _mfsdp_cfg()
    cfg.checkpoint.ckpt_format = "torch_dist"
    with pytest.raises(ConfigValidationError, match=r"\[rule megatron_fsdp_ckpt_format\]") as info:
        cfg.validate(world_size=2)
    message = str(info.value)
    assert "checkpoint.ckpt_format='fsdp_dtensor'" in message and "Megatron-Bridge refuses the same" in message
    assert "checkpoint.ckpt_format" in info.value.paths


@pytest.mark.parametrize("setting", [{"ddp.data_parallel_sharding_strategy": "no_shard"},
                                     {"checkpoint.pretrained_checkpoint": "/tmp/mb-pretrained"},
                                     {"checkpoint.pretrained_checkpoint": "/tmp/mb-pretrained",
                                      "checkpoint.load": None, "checkpoint.save": None}])
def test_no_shard_checkpoints_and_pretrained_checkpoint_pass_validation(setting: dict) -> None:
    """no_shard checkpoints (their own SwiGLU split, mcore_megatron_fsdp_preprocess.py) and pretrained_checkpoint starts
    resume or load bit-exact (tests/functional_tests/mcore/test_wrappers.py): no rule refuses them."""
    cfg = _mfsdp_cfg()
    for path, value in setting.items():
        section, field = path.split(".")
        setattr(getattr(cfg, section), field, value)
    cfg.validate(world_size=2)


def test_fsdp_dtensor_without_megatron_fsdp_names_torch_dist() -> None:
    cfg = _mfsdp_cfg()
    cfg.dist.use_megatron_fsdp = cfg.ddp.use_megatron_fsdp = False
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=2)
    assert "checkpoint.ckpt_format" in info.value.paths


# ----------------------------------------------------------------------------------------------- safe reader
def _planner_read(obj: object) -> object:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    planner = mcore_reader.SafeMegatronLoadPlanner()
    planner.flatten_state_dict = False
    planner.state_dict = {}
    item = SimpleNamespace(dest_index=SimpleNamespace(fqn="rng_state.(0, 0).0.np_rng_state"))
    planner.load_bytes(item, buffer)
    return planner.state_dict["rng_state.(0, 0).0.np_rng_state"]


def test_planner_reads_megatron_rng_state() -> None:
    state = (random.getstate(), np.random.get_state())
    loaded = _planner_read(state)
    assert loaded[0] == state[0] and np.array_equal(loaded[1][1], state[1][1])


def test_planner_refuses_code() -> None:
    import os

    with pytest.raises(CheckpointError, match="not allowed or is corrupt"):
        _planner_read({"payload": os.system})


# ------------------------------------------------------------------------------------------- folder detection
def _write_megatron_bridge_like(folder: Path) -> None:
    """A DCP folder with the top-level keys Megatron-Bridge's fsdp_dtensor save writes (no manifest)."""
    state = {"checkpoint_version": 3.0, "iteration": 2,
             "model": {"decoder.final_layernorm.weight": torch.ones(4)},
             "optimizer": {"state": {"module.module.decoder.final_layernorm.weight": {"exp_avg": torch.zeros(4)}}}}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder)), no_dist=True)


def test_megatron_bridge_fsdp_dtensor_folder_is_recognized(tmp_path: Path) -> None:
    folder = tmp_path / "iter_0000002"
    _write_megatron_bridge_like(folder)
    assert mcore_megatron_fsdp.is_fsdp_dtensor_folder(folder)
    source = loading.inspect_folder(folder, weights_only=False)
    assert (source.kind, source.step, source.has_optimizer) == (loading.MCORE_FSDP_DTENSOR, 2, True)
    assert source.kind in loading.MCORE_KINDS


def test_plain_dcp_folder_is_not_fsdp_dtensor(tmp_path: Path) -> None:
    dcp.save({"weights": torch.ones(2)}, storage_writer=dcp.FileSystemWriter(str(tmp_path)), no_dist=True)
    assert not mcore_megatron_fsdp.is_fsdp_dtensor_folder(tmp_path)


@pytest.mark.parametrize(("use_megatron_fsdp", "kind", "expected"), [
    (True, "mcore_dist", "cannot load"), (False, loading.MCORE_FSDP_DTENSOR, "dist.use_megatron_fsdp=True")])
def test_checkpoint_of_the_other_wrapper_is_a_named_error(use_megatron_fsdp: bool, kind: str, expected: str) -> None:
    manager = SimpleNamespace(cfg=SimpleNamespace(dist=SimpleNamespace(use_megatron_fsdp=use_megatron_fsdp)))
    source = loading.LoadSource("/ckpt/iter_0000002", kind, 2, False)
    with pytest.raises(CheckpointError, match=expected):
        CheckpointManager._check_mcore_format(manager, source)  # type: ignore[arg-type]
    same = "mcore_dist" if not use_megatron_fsdp else loading.MCORE_FSDP_DTENSOR
    CheckpointManager._check_mcore_format(manager, loading.LoadSource("/c", same, 2, False))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ preprocessing
@pytest.mark.parametrize("bf16", [False, True])
def test_swiglu_lookup_resolves_model_and_optimizer_names_through_float16module(bf16: bool) -> None:
    """megatron-core's SwiGLU split looks model keys up as ``module.<key>`` and optimizer names less one ``module.``;
    the view resolves both, also through a Float16Module (which the state dict's names skip)."""
    from megatron.core.transformer.module import Float16Module

    from megatron_bridge.checkpoint.mcore_megatron_fsdp_preprocess import _ParameterView

    gpt = torch.nn.Module()
    gpt.decoder = torch.nn.Linear(2, 2)
    inner = Float16Module.__new__(Float16Module) if bf16 else gpt
    if bf16:
        torch.nn.Module.__init__(inner)
        inner.module = gpt
    fsdp = torch.nn.Module()
    fsdp.module = inner
    view = _ParameterView(fsdp)
    assert view.get_parameter("module.module.decoder.weight") is gpt.decoder.weight  # a model key, "module." added
    optimizer_name = "module." * (4 if bf16 else 3) + "decoder.weight"
    assert view.get_parameter(optimizer_name[len("module."):]) is gpt.decoder.weight


# --------------------------------------------------------------------------------------------------- precision
def test_optimizer_of_another_precision_is_refused_before_reading(tmp_path: Path) -> None:
    """A bf16_mixed fsdp_dtensor checkpoint's optimizer (its run_config.yaml says so) into an fp32 run: the named
    precision error (checkpoint/saved_run.py), before any key is compared or tensor read."""
    import yaml

    from megatron_bridge.checkpoint.saved_run import PrecisionMismatchError
    from megatron_bridge.config.container import ConfigContainer

    folder = tmp_path / "iter_0000002"
    _write_megatron_bridge_like(folder)
    (folder / "run_config.yaml").write_text(yaml.safe_dump({"optimizer": {"bf16": True, "fp16": False}}))
    parts = SimpleNamespace(cfg=ConfigContainer())  # fp32: optimizer.bf16 = optimizer.fp16 = False
    with pytest.raises(PrecisionMismatchError, match="checkpoint.load_optim=False"):
        mcore_megatron_fsdp.load(parts, folder, load_optim=True, load_rng=False)  # type: ignore[arg-type]
