"""Checkpoints of the megatron-core engine (``model.engine="megatron_core"``): megatron-core ``torch_dist`` folders
as Megatron-LM and Megatron-Bridge write them, on 2 gloo ranks through the test-only CPU harness
(tests/functional_tests/mcore_cpu_harness.py). One launch runs the 2-rank tests (LaunchGroups):

* save at step 2 → resume: the resumed run's per-step losses equal the uninterrupted run's bit for bit, at TP=2 and
  at DP=2 with the distributed optimizer;
* a checkpoint written by megatron-core's own ``dist_checkpointing.save`` in Megatron-Bridge's layout
  (megatron_bridge_writer.py, none of this library's checkpoint code) resumes here, bit-exact as well;
* our checkpoint loads with megatron-core's own ``dist_checkpointing.load`` into the model's
  ``sharded_state_dict`` and gives the weights our loader restored; its common state holds Megatron's keys;
* resharding: the TP=2 checkpoint resumes at TP=1 × DP=2 (model and Adam state resharded; losses within 1e-5,
  TP changes the summation order);
* PP=2 × VPP=2: resume bit-exact, and the checkpoint resumes at TP=2 without stages (within 1e-5).

The conversion round trip (native ↔ megatron-core, exact) runs in the launching process.
"""

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from megatron_bridge.training.callbacks import Callback
from tests.functional_tests.launcher import LaunchGroups, is_worker, selected_groups


pytest.importorskip("megatron.core", reason="the megatron-core engine needs megatron-core (Python 3.12 environment)")

HARNESS_ENV = {"MEGATRON_BRIDGE_MCORE_CPU_HARNESS": "1"}
STEPS, SAVE_AT = 4, 2
RESHARD_RTOL = 1e-5
TP2 = {"model.tensor_model_parallel_size": 2}
DP2_DIST_OPT = {"optimizer.use_distributed_optimizer": True, "ddp.use_distributed_optimizer": True}
PP2_VPP2 = {"model.pipeline_model_parallel_size": 2, "model.virtual_pipeline_model_parallel_size": 2}
GROUPS = {2: ["test_tensor_parallel_resume_is_bit_exact_and_loads_in_megatron_core",
              "test_megatron_bridge_checkpoint_resumes_bit_exact",
              "test_tensor_parallel_checkpoint_resumes_data_parallel",
              "test_distributed_optimizer_resume_is_bit_exact",
              "test_pipeline_resume_is_bit_exact_and_reshards"]}

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.timeout(900),
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU harness test (megatron-core runs natively on CUDA)"),
]


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The 2-rank launch (launching process only), running the tests of the group this session selected."""
    if is_worker():
        return None
    groups = selected_groups(request, GROUPS)
    work = tmp_path_factory.mktemp("mcore_ckpt")
    return LaunchGroups(__file__, groups, {2: 840}, env={**HARNESS_ENV, "MB_MCORE_CKPT_DIR": str(work)})


# ------------------------------------------------------------------------------------------------ worker side
@pytest.fixture(scope="module", autouse=True)
def _stop_megatron_core_writer_process() -> Any:
    """Worker: at the end, stop the multiprocessing manager megatron-core's torch_dist writer starts at the first save
    (its results queue). A normal exit stops it (atexit); conftest.py ends workers with os._exit."""
    yield
    import sys

    module = sys.modules.get("megatron.core.dist_checkpointing.strategies.filesystem_async")
    queue = getattr(module, "_results_queue", None)
    if queue is not None and getattr(queue, "_manager", None) is not None:
        queue._manager.shutdown()
        module._results_queue = None  # type: ignore[union-attr]


def _work() -> Path:
    return Path(os.environ["MB_MCORE_CKPT_DIR"])


def _config(overrides: dict[str, Any], save: Path | None, load: Path | None = None) -> Any:
    from tests.functional_tests.training.test_megatron_core_engine import mcore_config

    cfg = mcore_config(**overrides)
    cfg.train.train_iters = STEPS
    cfg.scheduler.lr_warmup_iters = 1
    c = cfg.checkpoint
    c.save, c.save_interval, c.most_recent_k = (str(save) if save else None), SAVE_AT, -1
    if load is not None:
        c.load, c.ckpt_step = str(load), SAVE_AT
    return cfg


class _AtStep(Callback):
    """Calls ``fn(ctx)`` at the end of step ``step`` (``on_train_start`` when ``step`` is 0)."""

    def __init__(self, step: int, fn: Any) -> None:
        self.step, self.fn = step, fn

    def on_train_start(self, ctx: Any) -> None:
        if self.step == 0:
            self.fn(ctx)

    def on_step_end(self, ctx: Any, metrics: Any) -> None:
        if ctx.train_state.step == self.step:
            self.fn(ctx)


def _train(cfg: Any, *callbacks: Callback) -> list[float]:
    """pretrain() in the launch's process group (joined once, left alive for the next test: conftest.py)."""
    import torch.distributed as dist

    from megatron_bridge.models.mcore import parallel_state
    from megatron_bridge.training.pretrain import pretrain
    from tests.functional_tests.mcore_cpu_harness import install

    install()
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    parallel_state.destroy()  # megatron-core's groups of the previous run (another layout may follow)
    return pretrain(cfg, callbacks=list(callbacks)).losses


_STRAIGHT: dict[str, list[float]] = {}
"""Worker: losses of the uninterrupted runs of this launch, by layout name."""


def _straight(name: str, overrides: dict[str, Any], *callbacks: Callback) -> list[float]:
    if name not in _STRAIGHT:
        _STRAIGHT[name] = _train(_config(overrides, _work() / name), *callbacks)
        assert len(_STRAIGHT[name]) == STEPS
    return _STRAIGHT[name]


def _check_with_megatron_core_load(ctx: Any) -> None:
    """megatron-core's own loader reads our step-2 folder into the model's sharded_state_dict: the same weights our
    loader put into the model; the common state holds Megatron's keys."""
    from megatron.core import dist_checkpointing

    folder = _work() / "tp2" / f"iter_{SAVE_AT:07d}"
    model = ctx.backend.unwrap(ctx.backend.chunks[0])
    loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(folder))
    ours = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    theirs = {k: v for k, v in loaded["model"].items() if not k.endswith("_extra_state")}
    assert set(theirs) == set(ours)
    for key, value in ours.items():
        assert torch.equal(theirs[key], value), key
    assert loaded["iteration"] == SAVE_AT and loaded["checkpoint_version"] == 3.0
    assert {"opt_param_scheduler", "content_metadata"} <= set(loaded)
    assert loaded["opt_param_scheduler"]["num_steps"] == SAVE_AT * ctx.cfg.train.global_batch_size


def test_tensor_parallel_resume_is_bit_exact_and_loads_in_megatron_core(launches: LaunchGroups | None) -> None:
    """TP=2: save at step 2, resume; megatron-core's dist_checkpointing.load reads the folder."""
    if not is_worker():
        launches.check("test_tensor_parallel_resume_is_bit_exact_and_loads_in_megatron_core")  # type: ignore[union-attr]
        return
    from tests.functional_tests.mcore.megatron_bridge_writer import write_megatron_bridge_checkpoint

    straight = _straight("tp2", TP2, _AtStep(SAVE_AT, lambda ctx: write_megatron_bridge_checkpoint(
        ctx, _work() / "megatron_bridge")))
    resumed = _train(_config(TP2, _work() / "tp2_resumed", _work() / "tp2"), _AtStep(0, _check_with_megatron_core_load))
    assert resumed == straight[SAVE_AT:], (resumed, straight)
    root = _work() / "tp2" / f"iter_{SAVE_AT:07d}"
    assert {".metadata", "metadata.json", "train_state.pt", "run_config.yaml", "manifest.json"} <= {
        p.name for p in root.iterdir()}
    state = torch.load(root / "train_state.pt", weights_only=True)
    assert state["step"].item() == SAVE_AT and set(state) >= {"consumed_train_samples", "do_train"}


def test_megatron_bridge_checkpoint_resumes_bit_exact(launches: LaunchGroups | None) -> None:
    """A folder written as Megatron-Bridge writes it (megatron-core's own save, no manifest) resumes bit-exact."""
    if not is_worker():
        launches.check("test_megatron_bridge_checkpoint_resumes_bit_exact")
        return
    straight = _STRAIGHT.get("tp2")
    if straight is None:
        pytest.skip("needs the TP=2 run of the first test of this launch")
    cfg = _config(TP2, None, _work() / "megatron_bridge")
    cfg.checkpoint.ckpt_step = None  # through Megatron-Bridge's trackers
    assert not (_work() / "megatron_bridge" / f"iter_{SAVE_AT:07d}" / "manifest.json").exists()
    assert _train(cfg) == straight[SAVE_AT:]


def test_tensor_parallel_checkpoint_resumes_data_parallel(launches: LaunchGroups | None) -> None:
    """Resharding: the TP=2 checkpoint (model and Adam state) resumes at TP=1 × DP=2."""
    if not is_worker():
        launches.check("test_tensor_parallel_checkpoint_resumes_data_parallel")
        return
    straight = _STRAIGHT.get("tp2")
    if straight is None:
        pytest.skip("needs the TP=2 run of the first test of this launch")
    resumed = _train(_config({}, None, _work() / "tp2"))
    for a, b in zip(resumed, straight[SAVE_AT:], strict=True):
        assert abs(a - b) <= RESHARD_RTOL * abs(b), (resumed, straight)


def test_distributed_optimizer_resume_is_bit_exact(launches: LaunchGroups | None) -> None:
    """DP=2 with megatron-core's distributed optimizer (dp_reshardable state): save at step 2, resume."""
    if not is_worker():
        launches.check("test_distributed_optimizer_resume_is_bit_exact")
        return
    straight = _straight("dp2", DP2_DIST_OPT)
    resumed = _train(_config(DP2_DIST_OPT, _work() / "dp2_resumed", _work() / "dp2"))
    assert resumed == straight[SAVE_AT:], (resumed, straight)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"[mcore ckpt] dp2 distributed optimizer: straight {json.dumps(straight)} resumed {resumed}")


def test_pipeline_resume_is_bit_exact_and_reshards(launches: LaunchGroups | None) -> None:
    """PP=2 × VPP=2 (``model0``/``model1`` per rank, megatron-core's layer offsets): save at step 2, resume
    bit-exact; the same checkpoint resumes at TP=2 without pipeline stages (losses within 1e-5)."""
    if not is_worker():
        launches.check("test_pipeline_resume_is_bit_exact_and_reshards")
        return
    straight = _straight("pp2_vpp2", PP2_VPP2)
    resumed = _train(_config(PP2_VPP2, _work() / "pp2_vpp2_resumed", _work() / "pp2_vpp2"))
    assert resumed == straight[SAVE_AT:], (resumed, straight)
    resharded = _train(_config(TP2, None, _work() / "pp2_vpp2"))
    for a, b in zip(resharded, straight[SAVE_AT:], strict=True):
        assert abs(a - b) <= RESHARD_RTOL * abs(b), (resharded, straight)


# ----------------------------------------------------------------------------------------- launching process
def test_conversion_round_trip_native_mcore_exact(tmp_path: Path) -> None:
    """native checkpoint → megatron-core checkpoint → native checkpoint: every tensor equal; the megatron-core one
    holds megatron-core's keys (stacked layers) and its metadata.json."""
    if is_worker():
        pytest.skip("runs in the launching process")
    from megatron_bridge.bridge.checkpoints import write_streaming_checkpoint
    from megatron_bridge.checkpoint import mcore_reader
    from megatron_bridge.checkpoint.convert import convert_weights, read_model_weights
    from megatron_bridge.models.llama import LlamaModel
    from tests.functional_tests.training.test_megatron_core_engine import mcore_config

    cfg = mcore_config()
    cfg.model.engine = "native"
    torch.manual_seed(0)
    weights = {k: v.detach().clone() for k, v in LlamaModel(cfg.model).state_dict().items()}
    native = tmp_path / "native"
    native.mkdir()
    write_streaming_checkpoint(native, cfg, {k: (tuple(v.shape), v.dtype) for k, v in weights.items()},
                               weights.__getitem__)
    convert_weights(native, tmp_path / "mcore", "megatron_core")
    folder = tmp_path / "mcore" / "iter_0000000"
    keys = set(mcore_reader.check_mcore_folder(folder).state_dict_metadata)
    assert "decoder.layers.self_attention.linear_qkv.weight" in keys and mcore_reader.is_mcore_checkpoint(folder)
    convert_weights(tmp_path / "mcore", tmp_path / "back", "megatron")
    back = read_model_weights(tmp_path / "back")
    assert set(back) == set(weights)
    for name, tensor in weights.items():
        assert torch.equal(back[name], tensor), name
