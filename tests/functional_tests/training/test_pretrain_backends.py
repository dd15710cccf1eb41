"""pretrain() on 2 gloo ranks with DDP and FSDP2: finite, decreasing loss and parity with one process.

Run by plain pytest (which launches torchrun) or directly:
    python -m torch.distributed.run --nproc_per_node=2 -m pytest \
        tests/functional_tests/training/test_pretrain_backends.py::test_ddp_pretrain_basic -v -s
Parity tolerance (fp32, 8 AdamW steps on the same global batch of 8 samples): losses within 1e-5 relative, weights
within 2e-5 absolute. The distributed runs differ from the reference only in float summation order.

Launches (launcher.py's ``LaunchGroups``, each test reported on its own): the first runs the DDP and FSDP2 parity
tests and the first phase of the ZeRO-1 resume check on one shared process group; the second (new processes) runs the
resumed phase, then ``test_pretrain_twice_in_one_process``, whose pretrain() calls create and destroy their own groups.
The FSDP2 run also writes TensorBoard at ``logger.timing_log_level`` 2 with memory on: the timers' and memory's maxima
over ranks (an all-reduce every step on both ranks) reach the last rank's event file.
"""

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from megatron_bridge.training.callbacks import Callback
from megatron_bridge.training.pretrain import pretrain
from tests.functional_tests.launcher import LaunchGroups, is_worker, selected_groups
from tests.functional_tests.training._common import (
    FullWeights,
    assert_finite_decreasing,
    assert_matches_reference,
    cached_reference,
    small_config,
)


LOSS_RTOL = 1e-5
WEIGHT_ATOL = 2e-5

FIRST_LAUNCH = ["test_ddp_pretrain_basic", "test_fsdp2_pretrain_basic", "test_ddp_distributed_optimizer_pretrain"]
"""On one process group the tests join (``$MB_ZERO_PHASE=full``)."""
SECOND_LAUNCH = ["test_ddp_distributed_optimizer_pretrain", "test_pretrain_twice_in_one_process"]
"""New processes, no shared group (``$MB_ZERO_PHASE=resumed``)."""

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """Single-process run of the same config (computed once, in the launching process only)."""
    if is_worker():
        return None
    return cached_reference(small_config(), tmp_path_factory)


@pytest.fixture(scope="module")
def launches(reference: Path | None, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> tuple[LaunchGroups, LaunchGroups] | None:
    """The module's two launches (launching process only), each running the tests this session selected."""
    if is_worker():
        return None
    env = {"MB_REFERENCE": str(reference), "MB_ZERO_DIR": str(tmp_path_factory.mktemp("zero"))}
    return (LaunchGroups(__file__, selected_groups(request, {2: FIRST_LAUNCH}), {2: 600},
                         env={**env, "MB_ZERO_PHASE": "full", "MB_SHARED_GROUP": "1"}),
            LaunchGroups(__file__, selected_groups(request, {2: SECOND_LAUNCH}), {2: 600},
                         env={**env, "MB_ZERO_PHASE": "resumed"}))


def _join_shared_group() -> None:
    """Worker of the first launch: one process group for its tests; pretrain() reuses it and leaves it alive."""
    if os.environ.get("MB_SHARED_GROUP") and not dist.is_initialized():
        dist.init_process_group("gloo")


def _run_and_compare(use_fsdp2: bool, tensorboard: Path | None = None) -> None:
    _join_shared_group()
    cfg = small_config(use_torch_fsdp2=use_fsdp2)
    if tensorboard is not None:  # every timer and memory: maxima over both ranks (an all-reduce on each rank)
        lc = cfg.logger
        lc.tensorboard_dir, lc.timing_log_level, lc.log_world_size_to_tensorboard = str(tensorboard), 2, True
    weights = FullWeights()
    result = pretrain(cfg, callbacks=[weights])
    assert result.world_size == 2
    assert result.backend == ("fsdp2" if use_fsdp2 else "ddp")
    assert result.final_step == 8 and result.exit_reason == "train_iters"
    assert_finite_decreasing(result.losses)
    assert_matches_reference(result, weights.weights, loss_rtol=LOSS_RTOL, weight_atol=WEIGHT_ATOL,
                             label=f"backend={result.backend}")
    if tensorboard is not None and int(os.environ["RANK"]) == 1:  # the last rank writes
        _assert_timer_and_memory_tags(tensorboard)


def _assert_timer_and_memory_tags(folder: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from megatron_bridge.training.timers import TIMER_LEVELS

    events = EventAccumulator(str(folder))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {f"{name}-time" for name in TIMER_LEVELS} | {"iteration-time", "memory/mem-allocated-gigabytes",
                                                              "memory/mem-max-allocated-gigabytes", "world-size"}
    assert expected <= tags, expected - tags
    assert [e.value for e in events.Scalars("world-size")] == [2.0] * 8
    assert all(e.value > 0 for e in events.Scalars("forward-backward-time"))

@pytest.mark.support_cells("llama:ddp")
def test_ddp_pretrain_basic(launches: tuple[LaunchGroups, LaunchGroups] | None) -> None:
    if not is_worker():
        launches[0].check("test_ddp_pretrain_basic")  # type: ignore[index]
        return
    _run_and_compare(use_fsdp2=False)


@pytest.mark.support_cells("llama:fsdp2")
def test_fsdp2_pretrain_basic(launches: tuple[LaunchGroups, LaunchGroups] | None) -> None:
    if not is_worker():
        launches[0].check("test_fsdp2_pretrain_basic")  # type: ignore[index]
        return
    _run_and_compare(use_fsdp2=True, tensorboard=Path(os.environ["MB_ZERO_DIR"]) / "tb_fsdp2")


def test_pretrain_twice_in_one_process(launches: tuple[LaunchGroups, LaunchGroups] | None) -> None:
    """A script may call pretrain() again after it returned (each call creates and destroys its process groups):
    the second call must not hang on the first group's stale store keys, and trains the same numbers."""
    if not is_worker():
        launches[1].check("test_pretrain_twice_in_one_process")  # type: ignore[index]
        return
    assert not dist.is_initialized()  # the second launch shares no group: pretrain() makes its own
    first = pretrain(small_config())
    _run_and_compare(use_fsdp2=True)
    assert first.losses == pretrain(small_config()).losses  # the third call: same data, same seed, same numbers


class _ShardProbe(Callback):
    """Records whether the optimizer is ZeRO-1 and how many parameter elements this rank holds state for."""

    def on_train_end(self, ctx: Any) -> None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        from megatron_bridge.distributed.zero import local_parameter_count

        self.sharded = isinstance(ctx.optimizer, ZeroRedundancyOptimizer)
        self.local = local_parameter_count(ctx.optimizer) if self.sharded else -1
        self.total = sum(p.numel() for p in ctx.backend.parameters())
        self.with_state = sum(p.numel() for p in ctx.optimizer.optim.state) if self.sharded else -1


def test_ddp_distributed_optimizer_pretrain(launches: tuple[LaunchGroups, LaunchGroups] | None) -> None:
    """DDP with optimizer.use_distributed_optimizer (ZeRO-1): parity with the one-process reference, each rank holds
    optimizer state for part of the parameters only, and a resume from step 4 (in the second launch: new processes)
    repeats steps 5-8 exactly."""
    if not is_worker():
        for launch in launches:  # type: ignore[union-attr]
            launch.check("test_ddp_distributed_optimizer_pretrain")
        root = Path(launches[0].env["MB_ZERO_DIR"])  # type: ignore[index]
        full, resumed = (json.loads((root / f"{p}.json").read_text()) for p in ("full", "resumed"))
        assert resumed == full[4:], (resumed, full)
        return
    _join_shared_group()
    phase, root = os.environ["MB_ZERO_PHASE"], Path(os.environ["MB_ZERO_DIR"])
    cfg = small_config()
    cfg.optimizer.use_distributed_optimizer = True
    if phase == "full":
        cfg.checkpoint.save, cfg.checkpoint.save_interval = str(root / "ckpt"), 4
    else:
        cfg.checkpoint.load, cfg.checkpoint.ckpt_step = str(root / "ckpt"), 4
    weights, probe = FullWeights(), _ShardProbe()
    result = pretrain(cfg, callbacks=[weights, probe])
    assert result.backend == "ddp" and probe.sharded
    assert 0 < probe.local < probe.total and probe.with_state == probe.local, vars(probe)
    if phase == "full":
        assert_matches_reference(result, weights.weights, loss_rtol=LOSS_RTOL, weight_atol=WEIGHT_ATOL,
                                 label="backend=ddp+ZeRO-1")
    if int(os.environ["RANK"]) == 0:
        (root / f"{phase}.json").write_text(json.dumps(result.losses))
