"""The three ``ddp_wrap`` wrappers of megatron-core chunks (``model.engine="megatron_core"``) on 2 gloo ranks match one
process: megatron-core DDP, megatron-core's Megatron FSDP adapter (per sharding strategy) and megatron-core's
``TorchFullyShardedDataParallel`` (FSDP2), each with megatron-core's optimizer, through ``pretrain()``.

Each case trains the tiny Llama (4 layers, hidden 128, vocabulary padded to 512 under every TP size) for 8 steps of 8
samples in fp32 and must give the per-step losses of a one-process megatron-core DDP run within ``LOSS_RTOL``
(relative). Runs differ only in float summation order (measured 2026-12-01: within 8e-8 relative). FSDP2 with
``mixed_precision="bf16_mixed"`` must match a one-process bf16 megatron-core DDP run within ``BF16_RTOL`` (measured
2026-12-01: 3.0e-5, 2026-12-04: 3.2e-5; FSDP2 reduce-scatters bf16 gradients, DDP accumulates fp32 ones).

FSDP2 checkpoints (megatron-core ``torch_dist``): ``test_fsdp2`` (DP=2, with ``checkpoint.async_save``: while the
step-``SAVE_AT`` save is in flight neither its folder nor the trackers exist), ``test_fsdp2_tp2``,
``test_fsdp2_bf16`` (DP=2, ``bf16_mixed``) and ``test_megatron_core_ddp`` save at step ``SAVE_AT``; resuming FSDP2
from FSDP2 is bit-exact at DP=2 (from the async save), at TP=2 and in bf16 (losses, and the gathered model weights,
fp32 main parameters and Adam state after loading and at the end: fsdp2_checks.py); megatron-core DDP resumes the
FSDP2 checkpoint and FSDP2 resumes the DDP one within ``LOSS_RTOL`` (measured 2026-12-01: 6e-8 and 4e-8), and both
folders hold the same tensors (keys and global shapes); megatron-core DDP in bf16 resumes the FSDP2 bf16 checkpoint
with the same state after loading, bit for bit, and losses within ``BF16_RTOL``. A ``pretrained_checkpoint`` run
from the FSDP2 bf16 folder starts at step 0 with its weights and a fresh optimizer.

CPU: megatron-core and megatron-fsdp run on gloo through the test-only harness
(tests/functional_tests/mcore_cpu_harness.py, ``install_fsdp``), which makes megatron-fsdp's collectives synchronous.

Megatron FSDP also runs in ``bf16_mixed`` (against a one-process ``bf16_mixed`` run, ``BF16_RTOL``), and its
``no_shard``, ``optim``, ``optim_grads_params`` and ``bf16_mixed`` cases save an ``fsdp_dtensor`` checkpoint at step
``SAVE_AT`` that later cases of the same launch resume (``MFSDP_RESUMES``): their losses, and each rank's weights,
main weights and Adam state after loading and at the end, equal the uninterrupted run's bit for bit
(mfsdp_checks.py). ``optim_grads_params`` also writes its step-``SAVE_AT`` state as Megatron-Bridge does
(megatron_bridge_writer.py), which resumes the same way, and its checkpoint folder is a later run's
``pretrained_checkpoint``.

Launches: the one-process references and the 2-rank cases each share one torchrun launch (``GROUPS``, launcher.py's
``LaunchGroups``); the launching process compares the losses the workers wrote. Skipped with CUDA (the harness
replaces CUDA calls) and without megatron-core.
"""

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from megatron_bridge.training.callbacks import Callback
from tests.functional_tests.launcher import LaunchGroups, is_worker, selected_groups
from tests.functional_tests.mcore import mfsdp_checks
from tests.functional_tests.mcore.mfsdp_checks import MEGATRON_BRIDGE_FOLDER, MFSDP_PRETRAINED, MFSDP_RESUMES
from tests.functional_tests.mcore.test_checkpoint import (  # noqa: F401 (autouse: the checkpoint cases save)
    _stop_megatron_core_writer_process,
)


pytest.importorskip("megatron.core", reason="the megatron-core engine needs megatron-core (Python 3.12 environment)")

LOSS_RTOL = 1e-5
BF16_RTOL = 2e-4
STEPS = 8
SAVE_AT = 4
SAVED = f"iter_{SAVE_AT:07d}"
PADDED_VOCAB = 512
MFSDP = {"dist.use_megatron_fsdp": True}
FSDP2 = {"dist.use_torch_fsdp2": True}
TP2 = {"model.tensor_model_parallel_size": 2}
BF16 = {"mixed_precision": "bf16_mixed"}


def _save(name: str) -> dict[str, Any]:
    """Overrides that save the run at step ``SAVE_AT`` into ``<launch folder>/<name>``."""
    return {"checkpoint.save": f"{{work}}/{name}", "checkpoint.save_interval": SAVE_AT,
            "checkpoint.most_recent_k": -1}


def _resume(name: str) -> dict[str, Any]:
    """Overrides that resume from step ``SAVE_AT`` of ``<launch folder>/<name>``."""
    return {"checkpoint.load": f"{{work}}/{name}", "checkpoint.ckpt_step": SAVE_AT}


CASES: dict[str, dict[str, Any]] = {
    "test_megatron_core_ddp": _save("ddp"),
    "test_megatron_fsdp_no_shard": {**MFSDP, "ddp.data_parallel_sharding_strategy": "no_shard"},
    "test_megatron_fsdp_optim": {**MFSDP, "ddp.data_parallel_sharding_strategy": "optim"},
    "test_megatron_fsdp_optim_overlap": {**MFSDP, "ddp.data_parallel_sharding_strategy": "optim",
                                         "ddp.overlap_grad_reduce": True, "ddp.overlap_param_gather": True,
                                         "ddp.bucket_size": 20000},
    "test_megatron_fsdp_optim_grads": {**MFSDP, "ddp.data_parallel_sharding_strategy": "optim_grads"},
    "test_megatron_fsdp_optim_grads_params": {**MFSDP, "ddp.data_parallel_sharding_strategy": "optim_grads_params"},
    "test_megatron_fsdp_optim_grads_params_tp2": {**MFSDP, "ddp.data_parallel_sharding_strategy": "optim_grads_params",
                                                  "model.tensor_model_parallel_size": 2},
    "test_megatron_fsdp_optim_grads_params_resume": {**MFSDP,
                                                     "ddp.data_parallel_sharding_strategy": "optim_grads_params"},
    "test_megatron_fsdp_optim_resume": {**MFSDP, "ddp.data_parallel_sharding_strategy": "optim"},
    "test_megatron_fsdp_bf16_mixed": {**MFSDP, **BF16, "ddp.data_parallel_sharding_strategy": "optim_grads_params"},
    "test_megatron_fsdp_bf16_mixed_resume": {**MFSDP, **BF16,
                                             "ddp.data_parallel_sharding_strategy": "optim_grads_params"},
    "test_megatron_fsdp_no_shard_resume": {**MFSDP, "ddp.data_parallel_sharding_strategy": "no_shard"},
    "test_megatron_bridge_fsdp_dtensor_checkpoint_resumes": {
        **MFSDP, "ddp.data_parallel_sharding_strategy": "optim_grads_params"},
    "test_megatron_fsdp_pretrained_checkpoint": {**MFSDP, "ddp.data_parallel_sharding_strategy": "optim_grads_params",
                                                 "train.train_iters": 2},
    "test_fsdp2": {**FSDP2, **_save("fsdp2"), "checkpoint.async_save": True},
    "test_fsdp2_tp2": {**FSDP2, **TP2, **_save("fsdp2_tp2"), "fsdp2.fsdp2_forward_prefetch_depth": 0,
                       "fsdp2.fsdp2_backward_prefetch_depth": 1},
    "test_fsdp2_sync_every_microbatch_no_reshard": {**FSDP2, "fsdp2.defer_fsdp_grad_sync": False,
                                                    "fsdp2.reshard_after_forward": False},
    "test_fsdp2_bf16": {**FSDP2, **BF16, **_save("fsdp2_bf16")},
    "test_fsdp2_resume_is_bit_exact": {**FSDP2, **_resume("fsdp2")},
    "test_fsdp2_tp2_resume_is_bit_exact": {**FSDP2, **TP2, **_resume("fsdp2_tp2")},
    "test_fsdp2_checkpoint_resumes_under_megatron_core_ddp": _resume("fsdp2"),
    "test_megatron_core_ddp_checkpoint_resumes_under_fsdp2": {**FSDP2, **_resume("ddp")},
    "test_fsdp2_bf16_resume_is_bit_exact": {**FSDP2, **BF16, **_resume("fsdp2_bf16")},
    "test_fsdp2_bf16_checkpoint_resumes_under_megatron_core_ddp": {**BF16, **_resume("fsdp2_bf16")},
    "test_fsdp2_bf16_pretrained_checkpoint": {**FSDP2, **BF16,
                                              "checkpoint.pretrained_checkpoint": f"{{work}}/fsdp2_bf16/{SAVED}"},
}
"""2-rank case → config overrides (dotted paths; ``{work}`` is the launch's folder)."""
REFERENCES = {"test_one_process_reference": {}, "test_one_process_reference_bf16": BF16}
"""One-process megatron-core DDP runs → overrides."""
REFERENCE_OF = {"test_fsdp2_bf16": "test_one_process_reference_bf16",
                "test_megatron_fsdp_bf16_mixed": "test_one_process_reference_bf16",
                "test_fsdp2_bf16_pretrained_checkpoint": "test_one_process_reference_bf16"}
"""2-rank case → its one-process reference (default ``test_one_process_reference``)."""
RESUMES = {"test_fsdp2_resume_is_bit_exact": ("test_fsdp2", 0.0),
           "test_fsdp2_tp2_resume_is_bit_exact": ("test_fsdp2_tp2", 0.0),
           "test_fsdp2_checkpoint_resumes_under_megatron_core_ddp": ("test_fsdp2", LOSS_RTOL),
           "test_megatron_core_ddp_checkpoint_resumes_under_fsdp2": ("test_megatron_core_ddp", LOSS_RTOL),
           "test_fsdp2_bf16_resume_is_bit_exact": ("test_fsdp2_bf16", 0.0),
           "test_fsdp2_bf16_checkpoint_resumes_under_megatron_core_ddp": ("test_fsdp2_bf16", BF16_RTOL)}
"""Resumed case → (the case that saved its checkpoint, whose losses after step ``SAVE_AT`` it must give; relative
tolerance)."""
PRETRAINED = {"test_fsdp2_bf16_pretrained_checkpoint": "test_fsdp2_bf16"}
"""FSDP2 case starting from ``checkpoint.pretrained_checkpoint`` → the case that saved it (its step-``SAVE_AT``
weights)."""
RECORDED = {"test_fsdp2_bf16": None, "test_fsdp2_bf16_resume_is_bit_exact": "test_fsdp2_bf16",
            "test_fsdp2_bf16_checkpoint_resumes_under_megatron_core_ddp": "test_fsdp2_bf16", **PRETRAINED}
"""FSDP2 bf16 checkpoint cases whose full state (weights, fp32 main parameters, Adam state) the workers record
(fsdp2_checks.py) → the case whose recorded state they compare with (None: the saving run)."""
ASYNC_SAVES = {"test_fsdp2": "fsdp2"}
"""Case saving with ``checkpoint.async_save`` → its save folder: the step-``SAVE_AT`` save is not a checkpoint
while in flight, and is committed after it."""
GROUPS: dict[int, list[str]] = {1: list(REFERENCES), 2: list(CASES)}
LAUNCH_TIMEOUT_S = {1: 300, 2: 900}
SPLIT_BEFORE = ("test_fsdp2",)
"""The FSDP2 cases run in a launch of their own (launcher.py's ``LaunchGroups`` says why): each part's resumed cases
compare with the snapshots their saving case kept in memory in the same launch."""

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU harness test (megatron-core runs natively on CUDA)"),
]


def wrapper_config(**overrides: Any) -> Any:
    """The functional tests' tiny Llama on the megatron-core engine, ``STEPS`` steps, with ``overrides``."""
    from tests.functional_tests.training._common import small_config

    cfg = small_config(train_iters=STEPS)
    cfg.model.engine = "megatron_core"
    cfg.model.make_vocab_size_divisible_by = PADDED_VOCAB // int(overrides.get("model.tensor_model_parallel_size", 1))
    cfg = cfg.apply_overrides(None, [f"{k}={json.dumps(v)}" for k, v in overrides.items()])
    assert cfg.model.padded_vocab_size == PADDED_VOCAB
    return cfg


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The module's launches (launching process only); the workers write their losses to ``$MB_WRAPPERS_DIR``."""
    if is_worker():
        return None
    wanted = set(selected_groups(request, GROUPS)[2])
    wanted |= {RESUMES[name][0] for name in wanted if name in RESUMES}  # a resumed case needs its saving run
    wanted |= {MFSDP_RESUMES[name][0] for name in wanted if name in MFSDP_RESUMES}
    wanted |= {MFSDP_PRETRAINED[name] for name in wanted if name in MFSDP_PRETRAINED}
    wanted |= {PRETRAINED[name] for name in wanted if name in PRETRAINED}
    if "test_fsdp2_checkpoint_resumes_under_megatron_core_ddp" in wanted:
        wanted.add("test_megatron_core_ddp")  # it compares the two folders' tensors
    references = {"test_one_process_reference"} | {REFERENCE_OF[n] for n in wanted if n in REFERENCE_OF}
    groups = {1: [n for n in GROUPS[1] if n in references], 2: [n for n in GROUPS[2] if n in wanted]}
    work = tmp_path_factory.mktemp("mcore_wrappers")
    return LaunchGroups(__file__, groups, LAUNCH_TIMEOUT_S, env={"MB_WRAPPERS_DIR": str(work)},
                        split_before=SPLIT_BEFORE)


def train_and_record(name: str, overrides: dict[str, Any]) -> None:
    """Worker: train ``overrides`` on this launch's ranks (sharing its process group) and write rank 0's losses."""
    import torch.distributed as dist

    from tests.functional_tests.mcore_cpu_harness import install_fsdp, pretrain_in_launch

    install_fsdp()
    work = Path(os.environ["MB_WRAPPERS_DIR"])
    cfg = wrapper_config(**{k: v.format(work=work) if isinstance(v, str) else v for k, v in overrides.items()})
    mfsdp_checks.configure_checkpoints(name, cfg.checkpoint, work, SAVE_AT)
    bf16 = cfg.mixed_precision_config is not None and cfg.mixed_precision_config.bf16
    callbacks = [_Fp32MainWeights()] if bf16 and cfg.dist.use_megatron_fsdp else []
    if name in PREFETCH_CHECKED:
        f = cfg.fsdp2
        callbacks.append(_PrefetchChains(f.fsdp2_forward_prefetch_depth, f.fsdp2_backward_prefetch_depth))
    callbacks += _fsdp2_checkpoint_callbacks(name, work) + mfsdp_checks.case_callbacks(name, work, SAVE_AT)
    result = pretrain_in_launch(cfg, callbacks)
    assert result.final_step == cfg.train.train_iters, result
    assert all(c.checked for c in callbacks if isinstance(c, _PrefetchChains)), name
    _check_fsdp2_checkpoint_case(name, work, callbacks)
    mfsdp_checks.check_case(name, work, result.losses, callbacks, SAVE_AT)
    if dist.get_rank() == 0:
        record = {"backend": result.backend, "losses": result.losses}
        (Path(os.environ["MB_WRAPPERS_DIR"]) / f"{name}.json").write_text(json.dumps(record))


class _Fp32MainWeights(Callback):
    """Worker: with a bf16 preset under Megatron FSDP the model computes in bf16 and the optimizer steps on fp32 main
    weights (Megatron-Bridge's bf16_mixed)."""

    def on_train_start(self, ctx: Any) -> None:
        groups = ctx.backend.chunks[0].module.param_and_grad_buffer.parameter_groups
        assert {g.model_weight_buffer.dtype for g in groups} == {torch.bfloat16}  # compute weights
        assert {g.main_weight_buffer.dtype for g in groups} == {torch.float32}  # main weights
        main = {p.dtype for group in ctx.optimizer.optimizer.param_groups for p in group["params"]}
        assert main == {torch.float32}, main


PREFETCH_CHECKED = ("test_fsdp2", "test_fsdp2_tp2")
"""FSDP2 cases whose prefetch chains are checked: the default depths (forward 1, backward 2) and forward 0,
backward 1."""


class _PrefetchChains(Callback):
    """Worker: ``fsdp2.fsdp2_forward_prefetch_depth`` / ``fsdp2_backward_prefetch_depth`` reach megatron-core's FSDP2
    units: layer i prefetches layers i+1..i+forward in forward and i-1..i-backward in backward."""

    def __init__(self, forward: int, backward: int) -> None:
        self.forward, self.backward, self.checked = forward, backward, False

    def on_train_start(self, ctx: Any) -> None:
        from megatron.core.transformer.transformer_layer import TransformerLayer

        layers = [m for m in ctx.backend.chunks[0].module.modules() if isinstance(m, TransformerLayer)]
        index = {id(layer._get_fsdp_state()): i for i, layer in enumerate(layers)}
        got = [([index[id(s)] for s in layer._get_fsdp_state()._states_to_forward_prefetch],
                [index[id(s)] for s in layer._get_fsdp_state()._states_to_backward_prefetch]) for layer in layers]
        want = [(list(range(i + 1, min(i + 1 + self.forward, len(layers)))),
                 list(range(i - 1, max(i - 1 - self.backward, -1), -1))) for i in range(len(layers))]
        assert len(layers) >= 2 and got == want, (got, want)
        self.checked = True


def _fsdp2_checkpoint_callbacks(name: str, work: Path) -> list[Callback]:
    """Worker: the recorders and checks of the FSDP2 checkpoint cases (fsdp2_checks.py)."""
    from tests.functional_tests.mcore import fsdp2_checks

    callbacks: list[Callback] = []
    if name in RECORDED:
        callbacks.append(fsdp2_checks.Recorder(SAVE_AT))
    if name in ASYNC_SAVES:
        callbacks.append(fsdp2_checks.AsyncSaveInFlight(work / ASYNC_SAVES[name], SAVE_AT))
    return callbacks


def _check_fsdp2_checkpoint_case(name: str, work: Path, callbacks: list[Callback]) -> None:
    """Worker, after ``name`` trained: compare its recorded state with the saving run's (bit for bit after loading;
    the final state too when the wrapper is the same) and check its async saves."""
    from tests.functional_tests.mcore import fsdp2_checks

    if name in ASYNC_SAVES:
        (in_flight,) = [c for c in callbacks if isinstance(c, fsdp2_checks.AsyncSaveInFlight)]
        assert in_flight.checked, name
        fsdp2_checks.check_async_committed(work / ASYNC_SAVES[name], (SAVE_AT, STEPS))
    if name not in RECORDED:
        return
    (recorded,) = [c for c in callbacks if isinstance(c, fsdp2_checks.Recorder)]
    fsdp2_checks.check_precision(recorded, name)
    saver = RECORDED[name]
    if saver is None:
        fsdp2_checks.SNAPSHOTS[name] = recorded
    elif name in PRETRAINED:
        fsdp2_checks.check_pretrained_start(recorded, fsdp2_checks.SNAPSHOTS[saver], name)
    else:
        same_wrapper = "dist.use_torch_fsdp2" in CASES[name]
        fsdp2_checks.check_resumed(recorded, fsdp2_checks.SNAPSHOTS[saver], name, final=same_wrapper)


def compare(launches: LaunchGroups, name: str, backend: str) -> None:
    """Launching process: run the reference and ``name`` (their launches), then compare the recorded losses: with
    the one-process reference within ``LOSS_RTOL`` (bf16: ``BF16_RTOL``), or, for a resumed case, with the saving
    run's losses after step ``SAVE_AT`` (``RESUMES``)."""
    if name in RESUMES:
        reference, rtol = RESUMES[name]
        first, steps = SAVE_AT, STEPS - SAVE_AT
    else:
        reference = REFERENCE_OF.get(name, "test_one_process_reference")
        rtol, first, steps = (BF16_RTOL if reference.endswith("bf16") else LOSS_RTOL), 0, STEPS
    launches.check(reference)
    launches.check(name)
    folder = Path(launches.env["MB_WRAPPERS_DIR"])
    got = json.loads((folder / f"{name}.json").read_text())
    want = json.loads((folder / f"{reference}.json").read_text())
    want_losses = want["losses"][first:]
    assert got["backend"] == backend, got
    assert len(got["losses"]) == steps and want["losses"][-1] < want["losses"][0] - 0.05, want
    for a, b in zip(got["losses"], want_losses, strict=True):
        assert abs(a - b) <= rtol * abs(b), (name, got["losses"], want_losses)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got["losses"], want_losses))
    print(f"[parity] {name} ({backend}) vs {reference}: max relative loss difference {worst:.1e} over {steps} steps")


def _case(name: str, backend: str, launches: LaunchGroups | None) -> None:
    if is_worker():
        train_and_record(name, CASES[name])
    else:
        compare(launches, name, backend)  # type: ignore[arg-type]


def _reference(name: str, launches: LaunchGroups | None) -> None:
    if is_worker():
        train_and_record(name, REFERENCES[name])
    else:
        launches.check(name)  # type: ignore[union-attr]


def test_one_process_reference(launches: LaunchGroups | None) -> None:
    """One process, megatron-core DDP: the losses every fp32 2-rank case must match."""
    _reference("test_one_process_reference", launches)


def test_one_process_reference_bf16(launches: LaunchGroups | None) -> None:
    """One process, megatron-core DDP with ``mixed_precision="bf16_mixed"`` (Float16Module, fp32 main weights)."""
    _reference("test_one_process_reference_bf16", launches)


def test_megatron_core_ddp(launches: LaunchGroups | None) -> None:
    """megatron-core DistributedDataParallel, DP=2."""
    _case("test_megatron_core_ddp", "mcore_ddp", launches)


def test_megatron_fsdp_no_shard(launches: LaunchGroups | None) -> None:
    """Megatron FSDP adapter, no sharding (DDP-like all-reduce), DP=2."""
    _case("test_megatron_fsdp_no_shard", "mcore_megatron_fsdp", launches)


def test_megatron_fsdp_optim(launches: LaunchGroups | None) -> None:
    """Megatron FSDP adapter, optimizer state sharded (ZeRO-1): gradients reduced once, in finish_grad_sync."""
    _case("test_megatron_fsdp_optim", "mcore_megatron_fsdp", launches)


def test_megatron_fsdp_optim_overlap(launches: LaunchGroups | None) -> None:
    """ZeRO-1 with ``ddp.overlap_grad_reduce`` (gradients reduced in the last micro-batch's backward),
    ``ddp.overlap_param_gather`` and a small ``ddp.bucket_size`` (several communication units)."""
    _case("test_megatron_fsdp_optim_overlap", "mcore_megatron_fsdp", launches)


def test_megatron_fsdp_optim_grads(launches: LaunchGroups | None) -> None:
    """Megatron FSDP adapter, optimizer state and gradients sharded (ZeRO-2), DP=2."""
    _case("test_megatron_fsdp_optim_grads", "mcore_megatron_fsdp", launches)


def test_megatron_fsdp_optim_grads_params(launches: LaunchGroups | None) -> None:
    """Megatron FSDP adapter, parameters sharded too (ZeRO-3; TransformerLayer units), DP=2."""
    _case("test_megatron_fsdp_optim_grads_params", "mcore_megatron_fsdp", launches)


def test_megatron_fsdp_optim_grads_params_tp2(launches: LaunchGroups | None) -> None:
    """ZeRO-3 over megatron-core's tensor parallelism: TP=2 (DP=1)."""
    _case("test_megatron_fsdp_optim_grads_params_tp2", "mcore_megatron_fsdp", launches)


def test_megatron_fsdp_bf16_mixed(launches: LaunchGroups | None) -> None:
    """ZeRO-3 in bf16_mixed (bf16 compute in megatron-core's Float16Module, fp32 main weights and gradient
    reduction in megatron-fsdp) at DP=2 matches one process in bf16_mixed within ``BF16_RTOL``."""
    _case("test_megatron_fsdp_bf16_mixed", "mcore_megatron_fsdp", launches)


def test_megatron_fsdp_optim_grads_params_resume(launches: LaunchGroups | None) -> None:
    """ZeRO-3: the fsdp_dtensor checkpoint test_megatron_fsdp_optim_grads_params saved at step 4 resumes bit-exact
    (Megatron-Bridge's folder layout: tracker file, iter_0000004 with DCP shards and train_state.pt)."""
    _resume_case("test_megatron_fsdp_optim_grads_params_resume", launches)


def test_megatron_fsdp_optim_resume(launches: LaunchGroups | None) -> None:
    """ZeRO-1 (unsharded model weights; the SwiGLU split cut by the optimizer's shard): the fsdp_dtensor checkpoint
    of test_megatron_fsdp_optim resumes bit-exact."""
    _resume_case("test_megatron_fsdp_optim_resume", launches)


def test_megatron_fsdp_bf16_mixed_resume(launches: LaunchGroups | None) -> None:
    """ZeRO-3 in bf16_mixed: the step-4 checkpoint of test_megatron_fsdp_bf16_mixed (its fp32 main weights under the
    model keys, Adam state) resumes with the saving run's losses, bf16 compute weights, fp32 main weights and Adam
    state, after loading and at the end, bit for bit."""
    _resume_case("test_megatron_fsdp_bf16_mixed_resume", launches)


def test_megatron_fsdp_no_shard_resume(launches: LaunchGroups | None) -> None:
    """no_shard (replicated weights and Adam state; the SwiGLU split into replicated halves,
    mcore_megatron_fsdp_preprocess.py): the step-4 checkpoint of test_megatron_fsdp_no_shard resumes bit-exact
    (losses and state)."""
    _resume_case("test_megatron_fsdp_no_shard_resume", launches)


def test_megatron_bridge_fsdp_dtensor_checkpoint_resumes(launches: LaunchGroups | None) -> None:
    """A folder written as Megatron-Bridge writes fsdp_dtensor (megatron_bridge_writer.py: megatron-core's API only; no
    manifest, no metadata.json) at step 4 of test_megatron_fsdp_optim_grads_params resumes bit-exact, and holds the
    same tensors (keys, global shapes) as this library's own checkpoint of that step."""
    _resume_case("test_megatron_bridge_fsdp_dtensor_checkpoint_resumes", launches)
    if is_worker():
        return
    from megatron_bridge.checkpoint.reader import read_dcp_metadata

    def tensors(folder: str) -> dict[str, tuple[int, ...]]:
        metadata = read_dcp_metadata(Path(launches.env["MB_WRAPPERS_DIR"]) / folder / SAVED)  # type: ignore[union-attr]
        return {k: tuple(v.size) for k, v in metadata.state_dict_metadata.items()
                if hasattr(v, "size") and k.startswith(("model.", "optimizer.state."))}

    theirs, ours = tensors(MEGATRON_BRIDGE_FOLDER), tensors("test_megatron_fsdp_optim_grads_params_ckpt")
    assert "model.module.decoder.layers.0.mlp.linear_fc1.weight_w" in theirs, sorted(theirs)[:8]
    assert theirs == ours, sorted(set(theirs.items()) ^ set(ours.items()))[:8]


def test_megatron_fsdp_pretrained_checkpoint(launches: LaunchGroups | None) -> None:
    """ZeRO-3 from ``checkpoint.pretrained_checkpoint`` (test_megatron_fsdp_optim_grads_params's checkpoint folder:
    its latest step, 8): step 0 with the saved weights bit for bit and a fresh optimizer; training continues from
    the trained weights (a first loss well below a fresh start's)."""
    name = "test_megatron_fsdp_pretrained_checkpoint"
    if is_worker():
        train_and_record(name, CASES[name])
        return
    launches.check(MFSDP_PRETRAINED[name])  # type: ignore[union-attr]
    launches.check(name)  # type: ignore[union-attr]
    folder = Path(launches.env["MB_WRAPPERS_DIR"])  # type: ignore[union-attr]
    got = json.loads((folder / f"{name}.json").read_text())
    fresh = json.loads((folder / f"{MFSDP_PRETRAINED[name]}.json").read_text())["losses"]
    assert got["backend"] == "mcore_megatron_fsdp" and len(got["losses"]) == 2, got
    assert got["losses"][0] < fresh[0] - 0.2, (got, fresh)


def _resume_case(name: str, launches: LaunchGroups | None) -> None:
    if is_worker():
        train_and_record(name, CASES[name])  # asserts the bit-exact losses and state on every rank
        return
    saver, checkpoint = MFSDP_RESUMES[name]
    launches.check(saver)  # type: ignore[union-attr]
    launches.check(name)  # type: ignore[union-attr]
    folder = Path(launches.env["MB_WRAPPERS_DIR"])  # type: ignore[union-attr]
    root = folder / checkpoint
    last = SAVE_AT if checkpoint == MEGATRON_BRIDGE_FOLDER else STEPS
    assert (root / "latest_checkpointed_iteration.txt").read_text().strip() == str(last)
    step = root / SAVED
    assert {".metadata", "train_state.pt", "run_config.yaml"} <= {p.name for p in step.iterdir()}
    assert not (step / "metadata.json").exists()  # plain DCP (fsdp_dtensor), not megatron-core's torch_dist
    got = json.loads((folder / f"{name}.json").read_text())["losses"]
    want = json.loads((folder / f"{saver}.json").read_text())["losses"]
    assert got == want[SAVE_AT:], (got, want)
    print(f"[resume] {name}: losses of steps {SAVE_AT + 1}..{STEPS} and the state equal the uninterrupted run's "
          "bit for bit")


def test_fsdp2(launches: LaunchGroups | None) -> None:
    """megatron-core's TorchFullyShardedDataParallel (FSDP2), DP=2, deferred reduce-scatter."""
    _case("test_fsdp2", "mcore_fsdp2", launches)


def test_fsdp2_tp2(launches: LaunchGroups | None) -> None:
    """FSDP2 over megatron-core's tensor parallelism: TP=2 (DP=1)."""
    _case("test_fsdp2_tp2", "mcore_fsdp2", launches)


def test_fsdp2_sync_every_microbatch_no_reshard(launches: LaunchGroups | None) -> None:
    """FSDP2 with ``fsdp2.defer_fsdp_grad_sync=False`` (reduce-scatter after every micro-batch) and
    ``fsdp2.reshard_after_forward=False`` (no prefetch chains)."""
    _case("test_fsdp2_sync_every_microbatch_no_reshard", "mcore_fsdp2", launches)


def test_fsdp2_bf16(launches: LaunchGroups | None) -> None:
    """FSDP2 with ``mixed_precision="bf16_mixed"``: bf16 weights sharded by FSDP2, fp32 main weights (DTensor
    shards) in megatron-core's Float16OptimizerWithFloat16Params; matches one-process bf16 within ``BF16_RTOL``."""
    _case("test_fsdp2_bf16", "mcore_fsdp2", launches)


def test_fsdp2_resume_is_bit_exact(launches: LaunchGroups | None) -> None:
    """FSDP2, DP=2: resuming the step-4 torch_dist checkpoint of ``test_fsdp2`` gives its losses bit for bit."""
    _case("test_fsdp2_resume_is_bit_exact", "mcore_fsdp2", launches)


def test_fsdp2_tp2_resume_is_bit_exact(launches: LaunchGroups | None) -> None:
    """FSDP2 over TP=2: resuming the step-4 checkpoint of ``test_fsdp2_tp2`` gives its losses bit for bit."""
    _case("test_fsdp2_tp2_resume_is_bit_exact", "mcore_fsdp2", launches)


def test_fsdp2_checkpoint_resumes_under_megatron_core_ddp(launches: LaunchGroups | None) -> None:
    """megatron-core DDP resumes the FSDP2 checkpoint (model and Adam state); its folder holds the same tensors
    (keys, global shapes) as the one megatron-core DDP wrote."""
    _case("test_fsdp2_checkpoint_resumes_under_megatron_core_ddp", "mcore_ddp", launches)
    if is_worker():
        return
    from megatron_bridge.checkpoint.mcore_reader import check_mcore_folder

    def tensors(name: str) -> dict[str, tuple[int, ...] | None]:
        folder = Path(launches.env["MB_WRAPPERS_DIR"]) / name / f"iter_{SAVE_AT:07d}"  # type: ignore[union-attr]
        metadata = check_mcore_folder(folder).state_dict_metadata
        return {k: tuple(v.size) if hasattr(v, "size") else None for k, v in metadata.items()}

    fsdp2, ddp = tensors("fsdp2"), tensors("ddp")
    assert "optimizer.state.exp_avg.decoder.layers.mlp.linear_fc1.weight" in fsdp2
    assert fsdp2 == ddp, sorted(set(fsdp2.items()) ^ set(ddp.items()))


def test_megatron_core_ddp_checkpoint_resumes_under_fsdp2(launches: LaunchGroups | None) -> None:
    """FSDP2 resumes the step-4 checkpoint megatron-core DDP wrote."""
    _case("test_megatron_core_ddp_checkpoint_resumes_under_fsdp2", "mcore_fsdp2", launches)


def test_fsdp2_bf16_resume_is_bit_exact(launches: LaunchGroups | None) -> None:
    """FSDP2 in bf16_mixed, DP=2: resuming the step-4 checkpoint of ``test_fsdp2_bf16`` (bf16 weights, fp32 main
    parameters and Adam state as DTensor shards) gives its losses, and after loading and at the end its weights, main
    parameters and Adam state, bit for bit."""
    _case("test_fsdp2_bf16_resume_is_bit_exact", "mcore_fsdp2", launches)
    if is_worker():
        return
    from megatron_bridge.checkpoint.mcore_reader import check_mcore_folder

    folder = Path(launches.env["MB_WRAPPERS_DIR"]) / "fsdp2_bf16" / SAVED  # type: ignore[union-attr]
    dtypes = {k: v.properties.dtype for k, v in check_mcore_folder(folder).state_dict_metadata.items()
              if hasattr(v, "properties")}
    weight = "decoder.layers.mlp.linear_fc1.weight"
    assert dtypes[weight] == torch.bfloat16, dtypes  # the model weights, and their fp32 main parameters:
    assert {dtypes[f"optimizer.state.{k}.{weight}"] for k in ("fp32_param", "exp_avg", "exp_avg_sq")} == {
        torch.float32}, dtypes


def test_fsdp2_bf16_checkpoint_resumes_under_megatron_core_ddp(launches: LaunchGroups | None) -> None:
    """megatron-core DDP in bf16_mixed resumes the FSDP2 bf16 checkpoint: after loading, its weights, fp32 main
    parameters and Adam state equal the FSDP2 run's (gathered) bit for bit; losses within ``BF16_RTOL`` (DDP reduces
    fp32 gradients, FSDP2 bf16 ones)."""
    _case("test_fsdp2_bf16_checkpoint_resumes_under_megatron_core_ddp", "mcore_ddp", launches)


def test_fsdp2_bf16_pretrained_checkpoint(launches: LaunchGroups | None) -> None:
    """FSDP2 in bf16_mixed from ``checkpoint.pretrained_checkpoint`` (the step-4 folder of ``test_fsdp2_bf16``):
    step 0 with the saved weights bit for bit, main parameters from them, a fresh optimizer; training continues from
    the trained weights (a lower first loss than a fresh start's, falling)."""
    name = "test_fsdp2_bf16_pretrained_checkpoint"
    if is_worker():
        train_and_record(name, CASES[name])
        return
    launches.check("test_one_process_reference_bf16")  # type: ignore[union-attr]
    launches.check(name)  # type: ignore[union-attr]
    folder = Path(launches.env["MB_WRAPPERS_DIR"])  # type: ignore[union-attr]
    got = json.loads((folder / f"{name}.json").read_text())
    fresh = json.loads((folder / "test_one_process_reference_bf16.json").read_text())["losses"]
    assert got["backend"] == "mcore_fsdp2" and len(got["losses"]) == STEPS, got
    assert got["losses"][0] < fresh[0] - 0.05 and got["losses"][-1] < got["losses"][0], (got, fresh)
