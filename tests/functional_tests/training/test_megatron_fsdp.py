"""Megatron FSDP end to end through ``pretrain(cfg, forward_step)``.

The seed's smoke test runs on GPUs and on CPU, directly under torchrun or under plain pytest:
    python -m torch.distributed.run --nproc_per_node=2 -m pytest \
        tests/functional_tests/training/test_megatron_fsdp.py::TestMegatronFSDP::test_fsdp_pretrain_basic -v -s
Success: ``1 passed`` and a finite loss at the last iteration (the ``[smoke]`` line). With CUDA it runs megatron-fsdp's
real CUDA path (plain pytest launches min(2, number of GPUs) ranks: NCCL refuses two ranks on one GPU); without CUDA
the CPU harness below. The other GPU tests (``@pytest.mark.gpu``) are skipped without CUDA.

CPU (skipped when CUDA is present): the same backend on 2 gloo ranks through the test-only harness
(tests/functional_tests/megatron_fsdp_cpu_harness.py), which runs megatron-fsdp's CUDA code path on CPU with
synchronous collectives: parity with a one-process DDP run for every sharding strategy and at TP=2 (sequence
parallelism), and exact fsdp_dtensor resume.
The smoke test, the parity tests and the first phase of the resume check share one torchrun launch (``CPU_GROUPS``,
launcher.py's ``LaunchGroups``; each stays a test of its own); the resumed phase is a second launch (new processes).
"""

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.training.gpt_step import forward_step
from megatron_bridge.training.pretrain import pretrain
from tests.functional_tests.launcher import LaunchGroups, is_worker, launch, selected_groups
from tests.functional_tests.megatron_fsdp_cpu_harness import MegatronFullWeights
from tests.functional_tests.training._common import (
    assert_finite_decreasing,
    cached_reference,
    load_reference,
    max_weight_diff,
    small_config,
)


LOSS_RTOL = 1e-5
WEIGHT_ATOL = 2e-5
RESUME_RTOL_GPU = 1e-3  # NCCL and atomics in CUDA kernels make GPU runs not bitwise repeatable
STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")

CLASS = "TestMegatronFSDP"
CPU_GROUPS: dict[int, list[str]] = {2: [
    f"{CLASS}::test_fsdp_pretrain_basic",
    *(f"{CLASS}::test_cpu_harness_parity_with_ddp[{strategy}]" for strategy in STRATEGIES),
    f"{CLASS}::test_cpu_harness_save_resume",
    f"{CLASS}::test_cpu_harness_tp2_parity_with_ddp",
]}
"""Without CUDA: the tests launched together (one launch; the resume check's second phase is a launch of its own)."""

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]
needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU harness test (the GPU tests cover CUDA)")


def mfsdp_config(strategy: str = "optim_grads_params", **overrides: Any) -> ConfigContainer:
    """The functional tests' tiny Llama (8 samples/step, 2 per micro-batch) with the Megatron FSDP overrides of
    ``use_megatron_fsdp=True`` (meta-device init, fsdp_dtensor) and ``strategy``."""
    cfg = small_config(use_megatron_fsdp=True, **overrides)
    cfg.ddp.data_parallel_sharding_strategy = strategy
    if strategy == "no_shard":  # megatron-fsdp materializes meta models only when it shards parameters
        cfg.model.init_model_with_meta_device = False
    return cfg


def gpu_ranks() -> int:
    """Ranks for a GPU test launched by plain pytest: one per GPU, at most 2."""
    return max(1, min(2, torch.cuda.device_count()))


def smoke_ranks() -> int:
    """Ranks of the smoke test under plain pytest: one per GPU (at most 2), or 2 gloo ranks without CUDA."""
    return gpu_ranks() if torch.cuda.is_available() else 2


def install_cpu_harness() -> None:
    """Install the CPU harness in this worker (never with CUDA: it would replace the real CUDA calls) and join the
    launch's process group: pretrain() reuses it and leaves it alive for the launch's next test."""
    assert not torch.cuda.is_available()
    import torch.distributed as dist

    from tests.functional_tests.megatron_fsdp_cpu_harness import install

    install()
    if not dist.is_initialized():
        dist.init_process_group("gloo")


def resume_phase(base: Any) -> None:
    """Worker: phase ``$MB_MFSDP_PHASE`` of the resume check in ``$MB_MFSDP_DIR``: "full" trains 8 steps saving
    fsdp_dtensor checkpoints at 4 and 8; "resumed" loads step 4 and trains to 8. Rank 0 writes the losses."""
    phase, root = os.environ.get("MB_MFSDP_PHASE"), os.environ.get("MB_MFSDP_DIR")
    if not phase or not root:
        pytest.skip("the resume check runs as two torchrun jobs: start it with plain pytest")
    cfg = base()
    if phase == "full":
        cfg.checkpoint.save, cfg.checkpoint.save_interval = os.path.join(root, "ckpt"), 4
    else:
        cfg.checkpoint.load, cfg.checkpoint.ckpt_step = os.path.join(root, "ckpt"), 4
    result = pretrain(cfg, forward_step)
    assert result.backend == "megatron_fsdp" and result.final_step == 8
    if int(os.environ.get("RANK", "0")) == 0:
        Path(root, f"{phase}.json").write_text(json.dumps({"steps": result.steps, "losses": result.losses}))


def check_resume(nodeid: str, root: Path, nproc: int, phases: tuple[str, ...] = ("full", "resumed")
                 ) -> tuple[list[float], list[float]]:
    """Launch ``phases`` of :func:`resume_phase` as separate torchrun jobs (the "full" phase may have run in a shared
    launch already); returns (full, resumed) losses."""
    for phase in phases:
        launch(nodeid, nproc=nproc, env={"MB_MFSDP_PHASE": phase, "MB_MFSDP_DIR": str(root)})
    full = json.loads((root / "full.json").read_text())
    resumed = json.loads((root / "resumed.json").read_text())
    assert full["steps"] == list(range(1, 9)) and resumed["steps"] == [5, 6, 7, 8], (full, resumed)
    assert (root / "ckpt" / "iter_0000004").is_dir()
    return full["losses"], resumed["losses"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """One-process DDP run of the same model and data (launching process only; CPU tests only)."""
    if is_worker() or torch.cuda.is_available():
        return None
    return cached_reference(small_config(), tmp_path_factory)


@pytest.fixture(scope="module")
def launches(reference: Path | None, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> LaunchGroups | None:
    """Without CUDA, the module's shared launch (launching process only), running the tests this session selected;
    the resume check's first phase writes its checkpoints under ``$MB_MFSDP_DIR``."""
    if is_worker() or torch.cuda.is_available():
        return None
    resume_dir = tmp_path_factory.mktemp("mfsdp_resume")
    return LaunchGroups(__file__, selected_groups(request, CPU_GROUPS), {2: 900},
                        env={"MB_REFERENCE": str(reference), "MB_MFSDP_DIR": str(resume_dir),
                             "MB_MFSDP_PHASE": "full"})



def _train_matches_reference(cfg: ConfigContainer, label: str) -> None:
    """pretrain ``cfg`` on the 2 ranks: losses within LOSS_RTOL and final weights within WEIGHT_ATOL of the DDP
    reference."""
    weights = MegatronFullWeights()
    result = pretrain(cfg, forward_step, callbacks=[weights])
    assert result.backend == "megatron_fsdp" and result.world_size == 2 and result.final_step == 8
    assert_finite_decreasing(result.losses)
    ref = load_reference()
    for got, want in zip(result.losses, ref["losses"].tolist(), strict=True):
        assert abs(got - want) <= LOSS_RTOL * abs(want), (label, result.losses, ref["losses"].tolist())
    diff = max_weight_diff(weights.weights, ref["weights"])
    assert diff <= WEIGHT_ATOL, f"{label}: max weight difference {diff} > {WEIGHT_ATOL}"
    if int(os.environ["RANK"]) == 0:
        print(f"[parity] megatron_fsdp {label}: max weight diff {diff:.3e}, losses {result.losses}")


class TestMegatronFSDP:
    """Megatron FSDP through pretrain(): GPU smoke and resume, CPU-harness parity and resume."""

    def test_fsdp_pretrain_basic(self, launches: LaunchGroups | None) -> None:
        """The seed's smoke test: 10 steps of optim_grads_params (bf16 mixed precision); finite loss at the last
        iteration. With CUDA the real megatron-fsdp path; without, the same backend through the CPU harness on 2
        gloo ranks (``torch.distributed.run --nproc_per_node=2 -m pytest ...`` works on either)."""
        if not is_worker():
            if launches is None:  # CUDA: a launch of its own, one rank per GPU
                launch(f"{__file__}::{CLASS}::test_fsdp_pretrain_basic", nproc=smoke_ranks())
            else:
                launches.check(f"{CLASS}::test_fsdp_pretrain_basic")
            return
        if not torch.cuda.is_available():
            install_cpu_harness()
        cfg = mfsdp_config(train_iters=10, mixed_precision="bf16_mixed")
        result = pretrain(cfg, forward_step)
        assert result.backend == "megatron_fsdp" and result.final_step == 10 and len(result.losses) == 10
        assert math.isfinite(result.losses[-1]), result.losses
        per_step = sum(result.step_times[1:]) / max(len(result.step_times) - 1, 1)
        print(f"[smoke] backend=megatron_fsdp ranks={result.world_size} steps={result.final_step} "
              f"final_loss={result.final_loss:.4f} s_per_step={per_step:.4f} losses={result.losses}")

    @pytest.mark.gpu
    def test_fsdp_pretrain_save_resume(self, tmp_path: Path) -> None:
        """fsdp_dtensor checkpoint at step 4 of 8; a new job resumes and repeats steps 5-8 (within GPU noise)."""
        node = f"{__file__}::TestMegatronFSDP::test_fsdp_pretrain_save_resume"
        if is_worker():
            resume_phase(lambda: mfsdp_config(mixed_precision="bf16_mixed"))
            return
        full, resumed = check_resume(node, tmp_path, gpu_ranks())
        for got, want in zip(resumed, full[4:], strict=True):
            assert abs(got - want) <= RESUME_RTOL_GPU * abs(want), (resumed, full)
        print(f"[resume] backend=megatron_fsdp full={full} resumed={resumed}")

    @needs_no_cuda
    @pytest.mark.support_cells("llama:megatron_fsdp")
    @pytest.mark.parametrize("strategy", STRATEGIES)
    def test_cpu_harness_parity_with_ddp(self, strategy: str, launches: LaunchGroups | None) -> None:
        """Every sharding strategy (meta-device init where it applies) trains like one DDP process."""
        if not is_worker():
            launches.check(f"{CLASS}::test_cpu_harness_parity_with_ddp[{strategy}]")  # type: ignore[union-attr]
            return
        install_cpu_harness()
        _train_matches_reference(mfsdp_config(strategy), strategy)

    @needs_no_cuda
    def test_cpu_harness_tp2_parity_with_ddp(self, launches: LaunchGroups | None) -> None:
        """TP=2 with sequence parallelism (DP 1, meta-device init, optim_grads_params) trains like one DDP process:
        the TP plan's DTensor parameters become megatron-fsdp's TP-local ones (distributed/megatron_fsdp_tp.py)."""
        if not is_worker():
            launches.check(f"{CLASS}::test_cpu_harness_tp2_parity_with_ddp")  # type: ignore[union-attr]
            return
        install_cpu_harness()
        cfg = mfsdp_config(tensor_model_parallel_size=2, sequence_parallel=True)
        cfg.model.make_vocab_size_divisible_by = 64  # × TP: the reference's padded vocabulary (128)
        _train_matches_reference(cfg, "TP=2 (SP)")

    @needs_no_cuda
    def test_cpu_harness_save_resume(self, launches: LaunchGroups | None) -> None:
        """fsdp_dtensor save at step 4 (in the shared launch), resume in a new job: steps 5-8 repeat bit for bit (CPU
        is deterministic)."""
        node = f"{CLASS}::test_cpu_harness_save_resume"
        if is_worker():
            install_cpu_harness()
            resume_phase(mfsdp_config)
            return
        launches.check(node)  # type: ignore[union-attr]
        root = Path(launches.env["MB_MFSDP_DIR"])  # type: ignore[union-attr]
        full, resumed = check_resume(f"{__file__}::{node}", root, 2, phases=("resumed",))
        assert resumed == full[4:], (resumed, full)
