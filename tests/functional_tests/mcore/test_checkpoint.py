"""Checkpoints of the megatron-core engine (``model.engine="megatron_core"``): megatron-core ``torch_dist`` folders
as Megatron-LM and Megatron-Bridge write them, on 2 gloo ranks through the test-only CPU harness
(tests/functional_tests/mcore_cpu_harness.py). One launch runs the 2-rank tests (LaunchGroups); each layout trains
in the precision Megatron-Bridge's recipes use or one that covers another part of megatron-core's optimizer:

* ``bf16_mixed`` at TP=2 (bf16 weights in ``Float16Module``, fp32 main parameters in
  ``Float16OptimizerWithFloat16Params``): save at step 2 → resume: per-step losses, final model weights, fp32 main
  parameters and Adam state equal the uninterrupted run's bit for bit; megatron-core's own
  ``dist_checkpointing.load`` reads our folder (bf16 weights and fp32 main parameters equal to what our loader
  restored; the common state holds Megatron's keys);
* a bf16 checkpoint written by megatron-core's own ``dist_checkpointing.save`` in Megatron-Bridge's layout
  (megatron_bridge_writer.py, none of this library's checkpoint code) resumes here, bit-exact as well;
* resharding: the TP=2 checkpoint resumes at TP=1 × DP=2 (model, fp32 main parameters and Adam state resharded;
  losses within :data:`BF16_RESHARD_RTOL`, TP changes the summation order and bf16 rounds it);
* ``fp16_mixed`` at DP=2 with the distributed optimizer (fp32 main-parameter shards, ``dp_reshardable`` state,
  megatron-core's dynamic loss scaler): resume bit-exact (losses, weights, main parameters, Adam state) and the loss
  scaler's scale, growth and hysteresis trackers restored;
* ``bf16_mixed`` at PP=2 × VPP=2, saved with ``checkpoint.async_save`` (megatron-core's async
  ``dist_checkpointing.save``): the tracker files and ``iter_0000002`` appear only after the save is finalized;
  resume bit-exact, and the checkpoint resumes at TP=2 without stages (within :data:`BF16_RESHARD_RTOL`).

* fp32 at DP=2 (megatron-core's ``FP32Optimizer``, no main-parameter copies): resume bit-exact; that checkpoint in a
  ``bf16_mixed`` run: with its optimizer a named ``PrecisionMismatchError`` (both precisions, the folder, the fixes),
  with ``checkpoint.load_optim=False`` the bf16 weights and fp32 main parameters come from its fp32 weights;
* an async save abandoned in flight (the run fails at step 3 with the step-2 save unfinalized): the trackers keep
  step 1, a resume resolves step 1, megatron-core's writer process is gone and no process of the launch outlives it.

The conversion round trip (native ↔ megatron-core, exact) runs in the launching process, and so does the conversion
of a bf16 checkpoint (its bf16 model weights, the fp32 main parameters stay in the optimizer state).
"""

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from megatron_bridge.training.callbacks import Callback
from tests.functional_tests.launcher import LaunchGroups, is_worker, selected_groups
from tests.functional_tests.mcore.writer_process import (  # noqa: F401 (autouse fixture; test_wrappers.py imports it)
    stop_megatron_core_writer_process as _stop_megatron_core_writer_process,
)


pytest.importorskip("megatron.core", reason="the megatron-core engine needs megatron-core (Python 3.12 environment)")

STEPS, SAVE_AT = 4, 2
BF16_RESHARD_RTOL = 1e-3
"""bf16_mixed resharded (TP=2 → TP=1 × DP=2, PP=2 × VPP=2 → TP=2) vs the run that wrote the checkpoint, per step
(test_precision.py: TP=2 vs one process 5.3e-5)."""
BF16 = {"mixed_precision": "bf16_mixed"}
TP2 = {"model.tensor_model_parallel_size": 2}
TP2_BF16 = {**TP2, **BF16}
DP2_DIST_OPT = {"optimizer.use_distributed_optimizer": True, "ddp.use_distributed_optimizer": True}
DP2_FP16_DIST_OPT = {**DP2_DIST_OPT, "mixed_precision": "fp16_mixed"}
PP2_VPP2_BF16 = {"model.pipeline_model_parallel_size": 2, "model.virtual_pipeline_model_parallel_size": 2, **BF16}
GROUPS = {2: ["test_tensor_parallel_resume_is_bit_exact_and_loads_in_megatron_core",
              "test_megatron_bridge_checkpoint_resumes_bit_exact",
              "test_tensor_parallel_checkpoint_resumes_data_parallel",
              "test_native_sources_train_on_megatron_core_exactly",
              "test_distributed_optimizer_resume_is_bit_exact",
              "test_fp32_data_parallel_resume_is_bit_exact",
              "test_fp32_checkpoint_in_a_bf16_run_names_the_precisions",
              "test_pipeline_resume_is_bit_exact_and_reshards",
              "test_abandoned_async_save_leaves_the_previous_checkpoint"]}
"""The 2-rank tests, in this order, in three launches (``SPLIT_BEFORE``); the abandon test fails its run on purpose
(pretrain() then aborts the launch's process group), so it stays last."""
SPLIT_BEFORE = ("test_distributed_optimizer_resume_is_bit_exact", "test_pipeline_resume_is_bit_exact_and_reshards")
"""Tests that start a new launch (launcher.py's ``LaunchGroups`` says why): the TP=2 cases, the DP=2 cases and the
pipeline cases each share the uninterrupted runs they keep in memory (``_STRAIGHT``) within their launch."""

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
    selected = {item.name for item in request.session.items}
    if "test_bf16_checkpoint_converts_its_model_weights" in selected and GROUPS[2][0] not in groups[2]:
        groups[2] = [GROUPS[2][0], *groups[2]]  # its checkpoint
    work = tmp_path_factory.mktemp("mcore_ckpt")
    return LaunchGroups(__file__, groups, {2: 840}, env={"MB_MCORE_CKPT_DIR": str(work)},
                        split_before=SPLIT_BEFORE)


# ------------------------------------------------------------------------------------------------ worker side
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

    def on_train_step_end(self, ctx: Any) -> None:
        if ctx.train_state.step == self.step:
            self.fn(ctx)


def _train(cfg: Any, *callbacks: Callback) -> list[float]:
    """pretrain() in the launch's process group (joined once, left alive for the next test: conftest.py)."""
    from tests.functional_tests.mcore_cpu_harness import install, pretrain_in_launch

    install()
    return pretrain_in_launch(cfg, callbacks).losses


def _optimizers(optimizer: Any) -> list[Any]:
    return getattr(optimizer, "chained_optimizers", [optimizer])


def _scalar(value: Any) -> Any:
    return value.item() if torch.is_tensor(value) and value.numel() == 1 else value


def snapshot(ctx: Any) -> dict[str, Any]:
    """This rank's training state: every chunk's model weights, megatron-core's main parameters (fp32 with bf16/fp16;
    the distributed optimizer's shards), their Adam state, and the loss scaler's scale and trackers (fp16)."""
    out: dict[str, Any] = {}
    for i, chunk in enumerate(ctx.backend.chunks):
        for key, value in ctx.backend.unwrap(chunk).state_dict().items():
            if not key.endswith("_extra_state"):
                out[f"model{i}.{key}"] = value.detach().clone()
    for j, opt in enumerate(_optimizers(ctx.optimizer)):
        params = [p for group in opt.optimizer.param_groups for p in group["params"]]
        for n, param in enumerate(params):
            out[f"main{j}.{n}"] = param.detach().clone()
            for key, value in opt.optimizer.state[param].items():
                out[f"state{j}.{n}.{key}"] = _scalar(value.detach().clone() if torch.is_tensor(value) else value)
        scaler = getattr(opt, "grad_scaler", None)
        if scaler is not None:
            out[f"scaler{j}"] = (_scalar(scaler.scale), scaler._growth_tracker, scaler._hysteresis_tracker)
    return out


def assert_same_state(got: dict[str, Any], want: dict[str, Any], label: str) -> None:
    """Every tensor equal bit for bit (dtype included), every number equal."""
    assert set(got) == set(want), (label, sorted(set(got) ^ set(want))[:8])
    for key, value in want.items():
        if torch.is_tensor(value):
            assert value.dtype == got[key].dtype and torch.equal(got[key], value), (label, key)
        else:
            assert got[key] == value, (label, key, got[key], value)


class _Snapshots(Callback):
    """Records :func:`snapshot` at the end of step ``step`` (``at_step``) and at the end of training (``final``)."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.at_step: dict[str, Any] = {}
        self.final: dict[str, Any] = {}

    def on_train_start(self, ctx: Any) -> None:
        if self.step == 0:
            self.at_step = snapshot(ctx)

    def on_train_step_end(self, ctx: Any) -> None:
        if ctx.train_state.step == self.step:
            self.at_step = snapshot(ctx)

    def on_train_end(self, ctx: Any) -> None:
        self.final = snapshot(ctx)


_STRAIGHT: dict[str, tuple[list[float], _Snapshots]] = {}
"""Worker: losses and state snapshots of the uninterrupted runs of this launch, by layout name."""


def _straight(name: str, overrides: dict[str, Any], *callbacks: Callback,
              **checkpoint: Any) -> tuple[list[float], _Snapshots]:
    if name not in _STRAIGHT:
        snaps = _Snapshots(SAVE_AT)
        cfg = _config(overrides, _work() / name)
        for field, value in checkpoint.items():
            setattr(cfg.checkpoint, field, value)
        _STRAIGHT[name] = (_train(cfg, snaps, *callbacks), snaps)
        assert len(_STRAIGHT[name][0]) == STEPS
    return _STRAIGHT[name]


def _resume_bit_exact(name: str, overrides: dict[str, Any]) -> list[float]:
    """Resume layout ``name`` from its step-2 checkpoint: the state right after loading equals the uninterrupted
    run's at step 2, and the losses and final state equal its own, bit for bit."""
    straight, snaps = _STRAIGHT[name]
    resumed_snaps = _Snapshots(0)
    resumed = _train(_config(overrides, _work() / f"{name}_resumed", _work() / name), resumed_snaps)
    assert resumed == straight[SAVE_AT:], (resumed, straight)
    assert_same_state(resumed_snaps.at_step, snaps.at_step, f"{name}: state after loading step {SAVE_AT}")
    assert_same_state(resumed_snaps.final, snaps.final, f"{name}: final state")
    return resumed


def _check_with_megatron_core_load(ctx: Any) -> None:
    """megatron-core's own loader reads our step-2 folder into the model's and the optimizer's sharded_state_dict:
    the bf16 weights and fp32 main parameters our loader restored; the common state holds Megatron's keys."""
    from megatron.core import dist_checkpointing

    from megatron_bridge.checkpoint import mcore_state

    folder = _work() / "tp2" / f"iter_{SAVE_AT:07d}"
    model = ctx.backend.unwrap(ctx.backend.chunks[0])
    (opt,) = _optimizers(ctx.optimizer)
    main = [p.detach().clone() for group in opt.fp32_from_float16_groups for p in group]
    metadata = mcore_state.content_metadata(ctx.cfg)
    state = {"model": model.sharded_state_dict(metadata=metadata)}
    state["optimizer"] = ctx.optimizer.sharded_state_dict(state, metadata=metadata, is_loading=True)
    loaded = dist_checkpointing.load(state, str(folder))
    ours = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    theirs = {k: v for k, v in loaded["model"].items() if not k.endswith("_extra_state")}
    assert set(theirs) == set(ours)
    for key, value in ours.items():
        assert value.dtype == torch.bfloat16 and torch.equal(theirs[key], value), key
    their_main = [p for group in loaded["optimizer"]["fp32_from_fp16_params"] for p in group]
    assert len(their_main) == len(main) and all(
        a.dtype == torch.float32 and torch.equal(a, b) for a, b in zip(their_main, main, strict=True))
    assert loaded["iteration"] == SAVE_AT and loaded["checkpoint_version"] == 3.0
    assert {"opt_param_scheduler", "content_metadata"} <= set(loaded)
    assert loaded["opt_param_scheduler"]["num_steps"] == SAVE_AT * ctx.cfg.train.global_batch_size


def test_tensor_parallel_resume_is_bit_exact_and_loads_in_megatron_core(launches: LaunchGroups | None) -> None:
    """bf16_mixed at TP=2: save at step 2, resume bit-exact; megatron-core's dist_checkpointing.load reads the
    folder."""
    if not is_worker():
        launches.check("test_tensor_parallel_resume_is_bit_exact_and_loads_in_megatron_core")  # type: ignore[union-attr]
        return
    from tests.functional_tests.mcore.megatron_bridge_writer import write_megatron_bridge_checkpoint

    _straight("tp2", TP2_BF16, _AtStep(SAVE_AT, lambda ctx: write_megatron_bridge_checkpoint(
        ctx, _work() / "megatron_bridge")))
    straight, snaps = _STRAIGHT["tp2"]
    assert {v.dtype for k, v in snaps.final.items() if k.startswith("model")} == {torch.bfloat16}
    assert {v.dtype for k, v in snaps.final.items() if k.startswith("main")} == {torch.float32}
    resumed_snaps = _Snapshots(0)  # before megatron-core's load, which writes into the same tensors
    resumed = _train(_config(TP2_BF16, _work() / "tp2_resumed", _work() / "tp2"), resumed_snaps,
                     _AtStep(0, _check_with_megatron_core_load))
    assert resumed == straight[SAVE_AT:], (resumed, straight)
    assert_same_state(resumed_snaps.at_step, snaps.at_step, "tp2 bf16: state after loading step 2")
    assert_same_state(resumed_snaps.final, snaps.final, "tp2 bf16: final state")
    root = _work() / "tp2" / f"iter_{SAVE_AT:07d}"
    assert {".metadata", "metadata.json", "train_state.pt", "run_config.yaml", "manifest.json"} <= {
        p.name for p in root.iterdir()}
    state = torch.load(root / "train_state.pt", weights_only=True)
    assert state["step"].item() == SAVE_AT and set(state) >= {"consumed_train_samples", "do_train"}


def test_megatron_bridge_checkpoint_resumes_bit_exact(launches: LaunchGroups | None) -> None:
    """A bf16 folder written as Megatron-Bridge writes it (megatron-core's own save, no manifest) resumes
    bit-exact."""
    if not is_worker():
        launches.check("test_megatron_bridge_checkpoint_resumes_bit_exact")
        return
    if "tp2" not in _STRAIGHT:
        pytest.skip("needs the TP=2 run of the first test of this launch")
    straight, snaps = _STRAIGHT["tp2"]
    cfg = _config(TP2_BF16, None, _work() / "megatron_bridge")
    cfg.checkpoint.ckpt_step = None  # through Megatron-Bridge's trackers
    assert not (_work() / "megatron_bridge" / f"iter_{SAVE_AT:07d}" / "manifest.json").exists()
    resumed_snaps = _Snapshots(0)
    assert _train(cfg, resumed_snaps) == straight[SAVE_AT:]
    assert_same_state(resumed_snaps.final, snaps.final, "Megatron-Bridge's bf16 checkpoint: final state")


def test_tensor_parallel_checkpoint_resumes_data_parallel(launches: LaunchGroups | None) -> None:
    """Resharding: the bf16 TP=2 checkpoint (model, fp32 main parameters and Adam state) resumes at TP=1 × DP=2."""
    if not is_worker():
        launches.check("test_tensor_parallel_checkpoint_resumes_data_parallel")
        return
    if "tp2" not in _STRAIGHT:
        pytest.skip("needs the TP=2 run of the first test of this launch")
    straight = _STRAIGHT["tp2"][0]
    resumed = _train(_config(BF16, None, _work() / "tp2"))
    for a, b in zip(resumed, straight[SAVE_AT:], strict=True):
        assert abs(a - b) <= BF16_RESHARD_RTOL * abs(b), (resumed, straight)


def test_distributed_optimizer_resume_is_bit_exact(launches: LaunchGroups | None) -> None:
    """fp16_mixed at DP=2 with megatron-core's distributed optimizer (fp32 main-parameter shards, dp_reshardable
    state, dynamic loss scaler): save at step 2, resume bit-exact, the scaler's state restored."""
    if not is_worker():
        launches.check("test_distributed_optimizer_resume_is_bit_exact")
        return
    straight, snaps = _straight("dp2", DP2_FP16_DIST_OPT)
    scaler = snaps.at_step["scaler0"]
    assert scaler[1] == SAVE_AT, f"the growth tracker counts the steps without overflow: {scaler}"
    assert {v.dtype for k, v in snaps.final.items() if k.startswith("model")} == {torch.float16}
    assert {v.dtype for k, v in snaps.final.items() if k.startswith("main")} == {torch.float32}
    resumed = _resume_bit_exact("dp2", DP2_FP16_DIST_OPT)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"[mcore ckpt] dp2 fp16 distributed optimizer: straight {json.dumps(straight)} resumed {resumed}, "
              f"scaler at step {SAVE_AT} {scaler}")


def test_fp32_data_parallel_resume_is_bit_exact(launches: LaunchGroups | None) -> None:
    """fp32 at DP=2 (megatron-core's ``FP32Optimizer``, no main-parameter copies; the engine's default precision):
    save at step 2, resume bit-exact (losses, weights, Adam state)."""
    if not is_worker():
        launches.check("test_fp32_data_parallel_resume_is_bit_exact")
        return
    _straight("dp2_fp32", {})
    assert {v.dtype for k, v in _STRAIGHT["dp2_fp32"][1].final.items() if k.startswith("model")} == {torch.float32}
    _resume_bit_exact("dp2_fp32", {})


def _check_precision_mismatch(ctx: Any) -> None:
    """Start of a bf16_mixed run that loaded the fp32 step-2 checkpoint with ``load_optim=False``: its bf16 weights
    are the fp32 weights rounded, its fp32 main parameters equal them; a manager loading the optimizer too is refused
    with a named error before any tensor is read."""
    import copy

    from megatron_bridge.checkpoint import CheckpointManager
    from megatron_bridge.checkpoint.saved_run import PrecisionMismatchError
    from megatron_bridge.checkpoint.train_state import TrainState

    fp32 = _STRAIGHT["dp2_fp32"][1].at_step
    loaded = snapshot(ctx)
    models = {k: v for k, v in loaded.items() if k.startswith("model")}
    assert set(models) == {k for k in fp32 if k.startswith("model")}
    for key, value in models.items():
        assert value.dtype == torch.bfloat16 and torch.equal(value, fp32[key].bfloat16()), key
    (opt,) = _optimizers(ctx.optimizer)
    pairs = [(m, p) for gm, gp in zip(opt.fp32_from_float16_groups, opt.float16_groups, strict=True)
             for m, p in zip(gm, gp, strict=True)]
    assert pairs and all(m.dtype == torch.float32 and torch.equal(m, p.float()) for m, p in pairs)
    cfg = copy.deepcopy(ctx.cfg)
    cfg.checkpoint.load_optim, cfg.checkpoint.save = True, None
    manager = CheckpointManager(cfg, ctx.backend, ctx.optimizer, ctx.scheduler, TrainState())
    folder = str(_work() / "dp2_fp32" / f"iter_{SAVE_AT:07d}")
    with pytest.raises(PrecisionMismatchError) as error:
        manager.load()
    message = str(error.value)
    for part in (folder, "mixed_precision='fp32'", "mixed_precision='bf16_mixed'", "checkpoint.load_optim=False"):
        assert part in message, (part, message)


def test_fp32_checkpoint_in_a_bf16_run_names_the_precisions(launches: LaunchGroups | None) -> None:
    """The fp32 DP=2 step-2 checkpoint in a bf16_mixed run: with its optimizer state a PrecisionMismatchError naming
    both precisions, the folder and the fixes; with checkpoint.load_optim=False the weights load (rounded to bf16,
    main parameters from them) and training goes on."""
    if not is_worker():
        launches.check("test_fp32_checkpoint_in_a_bf16_run_names_the_precisions")
        return
    _straight("dp2_fp32", {})
    cfg = _config(BF16, None, _work() / "dp2_fp32")
    cfg.checkpoint.load_optim = False
    cfg.train.train_iters = SAVE_AT + 1  # one bf16 step shows training goes on (bf16 matmuls are slow on CPU)
    losses = _train(cfg, _AtStep(0, _check_precision_mismatch))
    assert len(losses) == 1 and losses[0] == losses[0], losses


class _InjectedFailure(RuntimeError):
    """The failure the abandon test raises in the middle of its run."""


_WRITERS: list[int] = []
"""Worker: PIDs of megatron-core's writer processes of the save the abandon test left in flight."""


def _fail_with_save_in_flight(ctx: Any) -> None:
    """End of step 3: step 1 committed (step 2's save finalized it first), step 2's async save scheduled and not
    finalized; record its writer process, then fail the run."""
    root = _work() / "abandon"
    saves = ctx.checkpoint._mcore_saves
    assert saves is not None and saves.pending() == 1
    _WRITERS.extend(c.async_caller.process.pid for c in saves.queue.async_calls if c.async_caller.process)
    assert (root / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    assert not (root / f"iter_{SAVE_AT:07d}").exists()
    raise _InjectedFailure("injected failure with an async save in flight")


def test_abandoned_async_save_leaves_the_previous_checkpoint(launches: LaunchGroups | None) -> None:
    """fp32 DP=2 with async saves every step fails at step 3, step 2's save in flight: pretrain() abandons it. The
    trackers still name step 1 (``latest_train_state.pt`` too), ``iter_0000002`` never appears, a resume resolves
    step 1 and the interrupted save's folder is removed at the next start; the writer processes are gone, no thread
    stays, and (launching process) no process of the launch outlives it."""
    if not is_worker():
        from tests.functional_tests.training.test_megatron_core_engine import _processes_with

        launches.check("test_abandoned_async_save_leaves_the_previous_checkpoint")  # type: ignore[union-attr]
        marker = f"MB_MCORE_CKPT_DIR={launches.env['MB_MCORE_CKPT_DIR']}"  # type: ignore[union-attr]
        assert not _processes_with(marker), "processes of the launch outlived it"
        return
    import multiprocessing
    import threading

    import torch.distributed as dist

    from megatron_bridge.checkpoint import files, run_folder
    from megatron_bridge.checkpoint.load import latest_step, resolve_source

    root = _work() / "abandon"
    cfg = _config({}, root)
    cfg.checkpoint.async_save, cfg.checkpoint.save_interval = True, 1
    try:
        with pytest.raises(_InjectedFailure):
            _train(cfg, _AtStep(SAVE_AT + 1, _fail_with_save_in_flight))
    finally:
        if dist.is_initialized():  # pretrain() aborted the launch's group: leave it without a collective
            dist.destroy_process_group()
    assert _WRITERS, "the step-2 save had no writer process"
    assert not [pid for pid in _WRITERS if Path(f"/proc/{pid}").exists()], "a writer process outlived abandon()"
    assert not multiprocessing.active_children()
    assert not [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if int(os.environ.get("RANK", "0")) != 0:
        return
    assert latest_step(root) == 1 and files.read_tracker_step(root) == 1
    assert files.list_checkpoints(root) == [1]
    assert [p.name for p in root.iterdir() if p.name.startswith(f"iter_{SAVE_AT:07d}")], "no interrupted save left"
    from megatron_bridge.config.checkpoint import CheckpointConfig

    source = resolve_source(CheckpointConfig(load=str(root)))
    assert source is not None and source.step == 1 and source.path.endswith("iter_0000001")
    run_folder.clean_interrupted_saves(root)
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("iter_")) == ["iter_0000001"]


def _check_async_save_not_committed(ctx: Any) -> None:
    """End of step 3 (the step-2 async save started, not finalized: that happens in the next poll): the writer may
    be done, but the step is not ``iter_0000002`` nor in the trackers; only its temporary folder exists."""
    root = _work() / "pp2_vpp2"
    names = {p.name for p in root.iterdir()}
    assert not ({"iter_0000002", "latest_checkpointed_iteration.txt", "latest_train_state.pt"} & names), names
    assert any(name.startswith("iter_0000002.tmp-") for name in names), names


def _native_sources(cfg: Any) -> Path:
    """Rank 0: the TP=2 run's step-2 weights as the native engine's checkpoint (DCP) and as a HF folder (through
    the on-the-fly conversion's child process, megatron-core's parallel state being set up here)."""
    from megatron_bridge.bridge.checkpoints import write_native_checkpoint
    from megatron_bridge.bridge.convert import write_hf_folder
    from megatron_bridge.bridge.converter import PretrainedConverter
    from megatron_bridge.checkpoint.reader import read_weights_file
    from megatron_bridge.config.container import ConfigContainer

    work = _work() / "native_sources"
    if int(os.environ.get("RANK", "0")) == 0:
        path, kind = PretrainedConverter().convert_for_engine(str(_work() / "tp2" / f"iter_{SAVE_AT:07d}"),
                                                              "mcore_dist", cfg.model, "native", work / "weights")
        assert kind == "weights"
        weights = read_weights_file(path)
        write_native_checkpoint(weights, ConfigContainer(model=cfg.model), work / "dcp")
        write_hf_folder(weights, cfg.model, work / "hf")
    torch.distributed.barrier()
    return work


def test_native_sources_train_on_megatron_core_exactly(launches: LaunchGroups | None) -> None:
    """Issue 26 item 3 on the megatron-core engine: the TP=2 bf16 run's step-2 weights as a native checkpoint and as
    a HF folder start a TP=2 bf16 run as ``pretrained_checkpoint`` with exactly those weights (converted on the fly
    to megatron-core's format in a child process); the HF folder's padded vocabulary rows are zeros."""
    if not is_worker():
        launches.check("test_native_sources_train_on_megatron_core_exactly")
        return
    if "tp2" not in _STRAIGHT:
        pytest.skip("needs the TP=2 run of the first test of this launch")
    want = {k: v for k, v in _STRAIGHT["tp2"][1].at_step.items() if k.startswith("model")}
    cfg = _config(TP2_BF16, None)
    work = _native_sources(cfg)
    rank, vocab = int(os.environ.get("RANK", "0")), cfg.model.vocab_size
    for kind in ("dcp", "hf"):
        cfg = _config(TP2_BF16, None)
        cfg.train.train_iters = 1
        cfg.checkpoint.pretrained_checkpoint = str(work / kind)
        loaded = _Snapshots(0)
        _train(cfg, loaded)
        got = {k: v for k, v in loaded.at_step.items() if k.startswith("model")}
        assert set(got) == set(want), kind
        for key, value in want.items():
            if kind == "hf" and key.endswith(("word_embeddings.weight", "output_layer.weight")):
                real = max(0, min(value.shape[0], vocab - rank * value.shape[0]))  # this TP rank's real rows
                assert torch.equal(got[key][:real], value[:real]) and not got[key][real:].any(), (kind, key)
            else:
                assert got[key].dtype == value.dtype and torch.equal(got[key], value), (kind, key)


def test_pipeline_resume_is_bit_exact_and_reshards(launches: LaunchGroups | None) -> None:
    """bf16_mixed at PP=2 × VPP=2 (``model0``/``model1`` per rank, megatron-core's layer offsets, fp32 main
    parameters of both chunks), saved with checkpoint.async_save: committed only when finalized; resume from the
    async step-2 save bit-exact; the same checkpoint resumes at TP=2 without pipeline stages (within
    :data:`BF16_RESHARD_RTOL`)."""
    if not is_worker():
        launches.check("test_pipeline_resume_is_bit_exact_and_reshards")
        return
    from megatron_bridge.checkpoint import files

    straight, _ = _straight("pp2_vpp2", PP2_VPP2_BF16, _AtStep(SAVE_AT + 1, _check_async_save_not_committed),
                            async_save=True)
    root = _work() / "pp2_vpp2"
    assert files.read_tracker_step(root) == STEPS  # the step-4 save was finalized at exit
    for step in (SAVE_AT, STEPS):
        folder = root / f"iter_{step:07d}"
        assert {"manifest.json", "metadata.json", ".metadata"} <= {p.name for p in folder.iterdir()}
    assert not [p.name for p in root.iterdir() if ".tmp-" in p.name]
    _resume_bit_exact("pp2_vpp2", PP2_VPP2_BF16)
    resharded = _train(_config(TP2_BF16, None, _work() / "pp2_vpp2"))
    for a, b in zip(resharded, straight[SAVE_AT:], strict=True):
        assert abs(a - b) <= BF16_RESHARD_RTOL * abs(b), (resharded, straight)


# ----------------------------------------------------------------------------------------- launching process
def test_conversion_round_trip_native_mcore_exact(tmp_path: Path) -> None:
    """native checkpoint → megatron-core checkpoint → native checkpoint: every tensor equal; the megatron-core one
    holds megatron-core's keys (stacked layers) and its metadata.json."""
    if is_worker():
        pytest.skip("runs in the launching process")
    from megatron_bridge.bridge.checkpoints import write_streaming_checkpoint
    from megatron_bridge.bridge.convert import convert_weights, read_model_weights
    from megatron_bridge.checkpoint import mcore_reader
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


def test_bf16_checkpoint_converts_its_model_weights(launches: LaunchGroups | None, tmp_path: Path) -> None:
    """Conversion of the launch's bf16 TP=2 checkpoint to the native engine takes its bf16 model weights (equal to
    the stored full tensors), not the fp32 main parameters of the optimizer state; back to megatron-core exact."""
    if is_worker():
        pytest.skip("runs in the launching process")
    from torch.distributed.checkpoint import load as dcp_load

    from megatron_bridge.bridge.convert import convert_weights, read_model_weights
    from megatron_bridge.checkpoint.reader import SafeFileSystemReader

    launches.check("test_tensor_parallel_resume_is_bit_exact_and_loads_in_megatron_core")  # type: ignore[union-attr]
    root = Path(launches.env["MB_MCORE_CKPT_DIR"]) / "tp2"  # type: ignore[union-attr]
    convert_weights(root, tmp_path / "native", "megatron", step=SAVE_AT)
    native = read_model_weights(tmp_path / "native")
    assert {t.dtype for t in native.values()} == {torch.bfloat16}
    stored = {"embedding.word_embeddings.weight": torch.empty_like(native["embed_tokens.weight"]),
              "decoder.final_layernorm.weight": torch.empty_like(native["norm.weight"]),
              "optimizer.state.fp32_param.embedding.word_embeddings.weight":
                  torch.empty(native["embed_tokens.weight"].shape, dtype=torch.float32)}
    dcp_load(stored, storage_reader=SafeFileSystemReader(root / f"iter_{SAVE_AT:07d}"), no_dist=True)
    assert torch.equal(native["embed_tokens.weight"], stored["embedding.word_embeddings.weight"])
    assert torch.equal(native["norm.weight"], stored["decoder.final_layernorm.weight"])
    main = stored["optimizer.state.fp32_param.embedding.word_embeddings.weight"]
    assert not torch.equal(main, main.bfloat16().float()), "the fp32 main parameters carry more than bf16 holds"
    convert_weights(tmp_path / "native", tmp_path / "mcore", "megatron_core")
    back = read_model_weights(tmp_path / "mcore")
    assert set(back) == set(native) and all(torch.equal(back[k], v) for k, v in native.items())
