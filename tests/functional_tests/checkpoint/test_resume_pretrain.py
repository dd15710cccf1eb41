"""Resume through the real ``pretrain()`` is bit-identical: 2N steps straight == N steps + save + restart the
processes + N steps (fp32, 2 ranks), for DDP and FSDP2, with async saves in the first run.

The straight run saves at step N while it keeps training (async: the state is staged at N, written in the
background); a second torchrun job loads that checkpoint with ``checkpoint.ckpt_step=N`` and trains to 2N.
The CPU backends share those two jobs (launcher.py's ``LaunchGroups``: one launch per phase, each backend a test of
its own, one process group per launch).
"""

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from megatron_bridge.config.container import ConfigContainer
from tests.functional_tests.launcher import LaunchGroups, is_worker, launch, selected_groups


N = 3
CPU_BACKENDS = ["test_resume_is_bit_identical[ddp]", "test_resume_is_bit_identical[fsdp2]"]
"""Launched together, once per phase."""


def resume_config(root: Path, backend: str, phase: str) -> ConfigContainer:
    """A small fp32 tiny-Llama run of 2N steps; ``phase`` "straight" saves at N, "resumed" loads step N."""
    from megatron_bridge.recipes import tiny_llama_pretrain_config

    cfg = tiny_llama_pretrain_config(train_iters=2 * N, global_batch_size=4, micro_batch_size=1, seq_length=32,
                                     eval_interval=None, log_interval=100, mixed_precision="fp32",
                                     use_torch_fsdp2=backend == "fsdp2",
                                     use_megatron_fsdp=True if backend == "megatron_fsdp" else None)
    cfg.model.num_layers, cfg.model.hidden_size, cfg.model.ffn_hidden_size = 2, 64, 128
    cfg.scheduler.lr_warmup_iters, cfg.scheduler.lr_warmup_fraction = 2, None
    cfg.logger.tensorboard_dir = None
    c = cfg.checkpoint
    c.ckpt_format = "torch_dist" if backend == "ddp" else "fsdp_dtensor"
    c.save = str(root / phase)
    c.save_interval, c.most_recent_k = N, -1
    if phase == "straight":
        c.async_save = backend != "megatron_fsdp"  # rule megatron_fsdp_async_save: Megatron FSDP saves synchronously
    else:
        c.load, c.ckpt_step = str(root / "straight"), N
    return cfg


def run_phase(root: Path, backend: str, phase: str) -> None:
    """Worker: run pretrain() and record its steps and losses (rank 0)."""
    from megatron_bridge.training.pretrain import pretrain

    if os.environ.get("MB_SHARED_GROUP") and not dist.is_initialized():
        dist.init_process_group("gloo")  # the launch's group: pretrain() reuses it and leaves it alive
    result = pretrain(resume_config(root, backend, phase))
    if int(os.environ.get("RANK", "0")) == 0:
        (root / f"{phase}.json").write_text(json.dumps({"steps": result.steps, "losses": result.losses}))


@pytest.fixture(scope="module")
def phases(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> list[LaunchGroups] | None:
    """The launches of the CPU backends (launching process only), straight then resumed; each backend runs in
    ``$CKPT_TEST_DIR/<backend>``."""
    if is_worker():
        return None
    groups = selected_groups(request, {2: CPU_BACKENDS})
    env = {"CKPT_TEST_DIR": str(tmp_path_factory.mktemp("resume")), "MB_SHARED_GROUP": "1"}
    return [LaunchGroups(__file__, groups, {2: 300}, env={**env, "CKPT_TEST_PHASE": phase})
            for phase in ("straight", "resumed")]


def check_resume(tmp_path: Path, backend: str, nproc: int) -> None:
    node = f"{__file__}::test_megatron_fsdp_resume_is_bit_identical"
    for phase in ("straight", "resumed"):
        env = {"CKPT_TEST_DIR": str(tmp_path), "CKPT_TEST_PHASE": phase}
        launch(node, nproc=nproc, env=env, timeout=240)
    compare_phases(tmp_path)


def compare_phases(tmp_path: Path) -> None:
    """The resumed run's steps and losses are the straight run's second half, bit for bit."""
    straight = json.loads((tmp_path / "straight.json").read_text())
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    assert straight["steps"] == list(range(1, 2 * N + 1))
    assert resumed["steps"] == list(range(N + 1, 2 * N + 1))
    assert resumed["losses"] == straight["losses"][N:]  # bit-identical, not approximately equal
    assert (tmp_path / "straight" / "latest_checkpointed_iteration.txt").read_text().strip() == str(2 * N)


@pytest.mark.support_cells("llama:resume")
@pytest.mark.parametrize("backend", ["ddp", "fsdp2"])
def test_resume_is_bit_identical(phases, backend):
    if is_worker():
        root = Path(os.environ["CKPT_TEST_DIR"]) / backend
        root.mkdir(exist_ok=True)
        run_phase(root, backend, os.environ["CKPT_TEST_PHASE"])
        return
    for launches in phases:
        launches.check(f"test_resume_is_bit_identical[{backend}]")
    compare_phases(Path(phases[0].env["CKPT_TEST_DIR"]) / backend)


@pytest.mark.gpu
def test_megatron_fsdp_resume_is_bit_identical(tmp_path):
    """Megatron FSDP has no CPU code path (see docs/training/checkpointing.md); same check on CUDA/NCCL."""
    if is_worker():
        run_phase(Path(os.environ["CKPT_TEST_DIR"]), "megatron_fsdp", os.environ["CKPT_TEST_PHASE"])
        return
    check_resume(tmp_path, "megatron_fsdp", nproc=min(2, torch.cuda.device_count()))
