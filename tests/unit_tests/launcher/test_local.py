"""megatron_bridge.launcher.local.worker_env: the environment a relaunch gives torchrun and its workers."""

import os
import subprocess
import sys

import pytest

from megatron_bridge.launcher.local import worker_env


def test_an_omp_num_threads_already_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    env = worker_env(2, threads_per_rank=1)
    assert env["OMP_NUM_THREADS"] == "5" and env["PYTHONUNBUFFERED"] == "1"


def test_threads_per_rank_or_cores_per_rank_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert worker_env(2, threads_per_rank=3)["OMP_NUM_THREADS"] == "3"
    import torch

    expected = None if torch.cuda.is_available() else str(max(1, (os.cpu_count() or 1) // 64))
    assert worker_env(64).get("OMP_NUM_THREADS") == expected  # at least 1 thread per rank


def test_torch_is_imported_only_for_the_default_thread_count() -> None:
    code = ("import os, sys; from megatron_bridge.launcher.local import worker_env; "
            "os.environ['OMP_NUM_THREADS'] = '1'; worker_env(2); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
