"""Checkpoints either engine trains from (issue 26 item 3), on the native engine in one process: a megatron-core
checkpoint (converted from a native run, or written by ``AutoBridge.import_ckpt(engine="megatron_core")``) as
``pretrained_checkpoint`` or ``checkpoint.load`` gives bit-equal weights through the on-the-fly conversion; what
cannot convert is refused with the fix; the import loads in megatron-core's own ``dist_checkpointing.load``. The
megatron-core engine's side (native checkpoints and HF folders on it) is
tests/functional_tests/mcore/test_checkpoint.py::test_native_sources_train_on_megatron_core_exactly."""

import json
from pathlib import Path

import pytest
import torch

from megatron_bridge import AutoBridge
from megatron_bridge.bridge.convert import convert_weights, read_hf_folder
from megatron_bridge.checkpoint import CheckpointManager
from megatron_bridge.config.checkpoint import CheckpointConfig
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.errors import CheckpointError
from tests.unit_tests.bridge.hf_models import hf_model
from tests.unit_tests.checkpoint.toy import build_run, full_weights, tiny_cfg, train


pytest.importorskip("megatron.core", reason="megatron-core checkpoints (Python 3.12 environment)")


@pytest.fixture(scope="module")
def mcore_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A megatron-core checkpoint (``convert.py --to megatron_core`` of a native run trained 2 steps) and the
    native run's weights."""
    root = tmp_path_factory.mktemp("native")
    run = build_run(tiny_cfg(save=str(root)))
    train(run, 2)
    run.manager.save()
    out = root.parent / "mcore"
    convert_weights(root, out, "megatron_core")
    return out, full_weights(run)


def _assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_megatron_core_checkpoint_as_pretrained_on_native_is_exact(mcore_checkpoint, tmp_path) -> None:  # noqa: ANN001
    root, weights = mcore_checkpoint
    run = build_run(tiny_cfg(pretrained_checkpoint=str(root), save=str(tmp_path / "run")), seed=3)
    assert run.manager.load() and run.state.step == 0
    _assert_equal(full_weights(run), weights)
    assert not list((tmp_path / "run").glob(".converted-*"))  # the converted copy is gone once loaded


def test_megatron_core_checkpoint_resumes_on_native(mcore_checkpoint, tmp_path) -> None:  # noqa: ANN001
    """``checkpoint.load`` of a megatron-core checkpoint without optimizer state: the weights, exactly, and its
    train state; one with optimizer state needs ``load_optim=False`` (the error names it)."""
    root, weights = mcore_checkpoint
    run = build_run(tiny_cfg(load=str(root)), seed=3)
    assert run.manager.load() and run.state.step == 0
    _assert_equal(full_weights(run), weights)

    manifest_path = root / "iter_0000000" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "has_optimizer": True}))
    try:
        with pytest.raises(CheckpointError, match=r"checkpoint\.load_optim=False.*model\.engine='megatron_core'"):
            build_run(tiny_cfg(load=str(root)), seed=3).manager.load()
        run = build_run(tiny_cfg(load=str(root), load_optim=False), seed=3)
        assert run.manager.load()
        _assert_equal(full_weights(run), weights)
    finally:
        manifest_path.write_text(json.dumps(manifest))


def test_without_a_converter_the_other_engines_checkpoint_is_refused(mcore_checkpoint) -> None:  # noqa: ANN001
    root, _ = mcore_checkpoint
    run = build_run(tiny_cfg(pretrained_checkpoint=str(root)))
    manager = CheckpointManager(run.cfg, run.backend, run.optimizer, run.scheduler, run.state)
    with pytest.raises(CheckpointError, match=r"converter=megatron_bridge\.bridge\.converter\.PretrainedConverter"):
        manager.load()


@pytest.fixture(scope="module", params=["llama3.1", "qwen3-moe"])
def hf_folder(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """An HF folder: a dense Llama, and a Qwen3-MoE (routed experts in megatron-core's ``SequentialMLP`` layout)."""
    folder = tmp_path_factory.mktemp("hf")
    hf_model(request.param).save_pretrained(folder)
    return folder


def test_import_ckpt_writes_megatron_core_and_native_trains_from_it(hf_folder, tmp_path) -> None:  # noqa: ANN001
    """``import_ckpt(engine="megatron_core")``: megatron-core's own ``dist_checkpointing.load`` reads it (the HF
    weights under megatron-core's names), and the native engine starts from it with the HF weights, exactly."""
    from megatron.core import dist_checkpointing

    from megatron_bridge.bridge.engine_checkpoints import _one_process_mcore, _tp1_model
    from megatron_bridge.engines.megatron_core.weights import native_to_megatron_core

    root = AutoBridge.import_ckpt(hf_folder, tmp_path / "mcore", engine="megatron_core")
    folder = root / "iter_0000000"
    assert (folder / "metadata.json").is_file() and (folder / "hf_assets" / "config.json").is_file()
    cfg = ConfigContainer.from_yaml(folder / "run_config.yaml")
    assert cfg.model.engine == "megatron_core"
    hf = read_hf_folder(hf_folder, cfg.model.padded_vocab_size)
    with _one_process_mcore():
        gpt = _tp1_model(cfg.model, cfg.model.padded_vocab_size)
        loaded = dist_checkpointing.load({"model": gpt.sharded_state_dict()}, str(folder))["model"]
        expected = native_to_megatron_core(hf, cfg.model)
        for name, tensor in expected.items():
            assert torch.equal(loaded[name], tensor), name

    cfg.model.engine = "native"
    cfg.checkpoint = CheckpointConfig(pretrained_checkpoint=str(root))
    run = build_run(cfg, seed=5)
    assert run.manager.load()
    _assert_equal(full_weights(run), hf)


def test_import_ckpt_refuses_an_unknown_engine(hf_folder, tmp_path) -> None:  # noqa: ANN001
    from megatron_bridge.errors import BridgeError

    with pytest.raises(BridgeError, match=r"import_ckpt\(engine='mcore'\).*'megatron_core'"):
        AutoBridge.import_ckpt(hf_folder, tmp_path / "x", engine="mcore")


def test_what_does_not_convert_is_refused_with_the_fix() -> None:
    from megatron_bridge.bridge.converter import PretrainedConverter
    from megatron_bridge.checkpoint.foreign import _refusal
    from megatron_bridge.checkpoint.load import LoadSource
    from megatron_bridge.engines.factory import get_engine

    converter, native = PretrainedConverter(), tiny_cfg()
    engine = get_engine(native)
    assert _refusal(LoadSource("/ckpt", "mcore_dist", 0, True), native, engine, converter) is None
    assert _refusal(LoadSource("/ckpt", "mcore_fsdp_dtensor", 0, True), native, engine, converter) is None
    no_converter = _refusal(LoadSource("/ckpt", "mcore_dist", 0, True), native, engine, None)
    assert no_converter is not None and "model.engine='megatron_core' format" in str(no_converter)
    assert "convert.py --to megatron" in str(no_converter)
    mcore = tiny_cfg()
    mcore.model.engine = "megatron_core"
    engine = get_engine(mcore)
    assert _refusal(LoadSource("/ckpt", "dcp", 0, True), mcore, engine, converter) is None
    mcore.dist.use_megatron_fsdp = True
    error = _refusal(LoadSource("/ckpt", "dcp", 0, True), mcore, engine, converter)
    assert error is not None and "dist.use_megatron_fsdp=False" in str(error)


def test_megatron_core_conversion_destroys_its_groups_in_a_process_that_keeps_its_own() -> None:
    """megatron-core's ``destroy_model_parallel`` only forgets its ~20 groups: a conversion in a process whose default
    group lives on (a notebook, a training job's set-up) must not leave them, each with a gloo thread and sockets."""
    import torch.distributed as dist

    from megatron_bridge.bridge.engine_checkpoints import _one_process_mcore

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True), rank=0,
                                world_size=1)
    try:
        registry = dist.distributed_c10d._world.pg_map
        before = {id(g) for g in registry}
        with _one_process_mcore():
            made = len(registry) - len(before)
        assert made > 0  # megatron-core's parallel state had its own groups
        assert {id(g) for g in registry} == before
    finally:
        if created:
            dist.destroy_process_group()
