"""Automatic restart and preemption of a 2-rank job started through ``python -m megatron_bridge.launcher.torchrun``
(what ``run_recipe.py`` and ``launch.py`` use), with ``job.py`` as the worker (10 steps, checkpoints every 5).

* kill -9 of rank 1 at step 7 with ``--max_restarts 1``, two launchers acting as two nodes: rc 0 on both, every
  worker restarted, resumed from step 5, and steps 6-10 have the uninterrupted run's losses bit for bit (CPU);
* a project error (exit code 2) with a restart budget: one attempt, its message once, rc 2;
* SIGUSR1 (the pre-time-limit signal) and then SIGTERM to the launcher in the middle of the run: the ranks stop at one
  step, a checkpoint is there, rc 0 with the tracker's step below train_iters; the next start resumes and the losses
  equal the uninterrupted run's.

One uninterrupted reference run for the whole file (module fixture).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron_bridge.utils.launch import reserved_port
from tests.functional_tests.launcher import REPO_ROOT, forked_workers_env


pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]


JOB = Path(__file__).with_name("job.py")
TIMEOUT_S = 300


def _cmd(port: int, *flags: str) -> list[str]:
    return [sys.executable, "-m", "megatron_bridge.launcher.torchrun", "--nproc_per_node=2", "--master_addr=127.0.0.1",
            f"--master_port={port}", *flags, str(JOB)]


def _env(run_dir: Path, **extra: str) -> dict[str, str]:
    """The launcher starts cold; its workers fork warm (launcher.py's forked_workers_env)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "MB_RUN_DIR": str(run_dir),
            **forked_workers_env(), **extra}


def _run(run_dir: Path, *flags: str, **extra: str) -> tuple[int, str]:
    run_dir.mkdir(parents=True, exist_ok=True)
    with reserved_port() as port:
        proc = subprocess.run(_cmd(port, *flags), cwd=REPO_ROOT, env=_env(run_dir, **extra), capture_output=True,
                              text=True, timeout=TIMEOUT_S)
    return proc.returncode, proc.stdout + proc.stderr


def _attempts(run_dir: Path) -> list[dict]:
    path = run_dir / "losses.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """Step -> loss of the uninterrupted 10-step run."""
    run_dir = tmp_path_factory.mktemp("reference")
    code, out = _run(run_dir)
    assert code == 0, out[-4000:]
    (attempt,) = _attempts(run_dir)
    assert attempt["steps"] == list(range(1, 11)), attempt
    return dict(zip(attempt["steps"], attempt["losses"], strict=True))


def _two_nodes(run_dir: Path, *flags: str, **extra: str) -> list[tuple[int, str]]:
    """Two launchers on this machine acting as two nodes of one process each: (exit code, output) per node."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with reserved_port() as port:
        procs = [subprocess.Popen([sys.executable, "-m", "megatron_bridge.launcher.torchrun", "--nnodes=2",
                                   f"--node_rank={node}", "--nproc_per_node=1", "--master_addr=127.0.0.1",
                                   f"--master_port={port}", *flags, str(JOB)],
                                  cwd=REPO_ROOT, env=_env(run_dir, **extra), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
        outputs = [proc.communicate(timeout=TIMEOUT_S)[0] for proc in procs]
    return [(proc.returncode, output) for proc, output in zip(procs, outputs, strict=True)]


def test_kill9_restarts_every_worker_from_the_last_checkpoint(tmp_path: Path, reference: dict[int, float]) -> None:
    """Two nodes: rank 1 (node 1) is SIGKILLed at step 7; both nodes restart their workers, which rejoin and resume."""
    (code0, out0), (code1, out1) = _two_nodes(tmp_path, "--max_restarts=1", MB_FAULT="kill:1:7")
    out = f"node 0:\n{out0[-3000:]}\nnode 1:\n{out1[-3000:]}"
    assert code0 == 0 and code1 == 0, out
    assert "rank 1 (node 1, host" in out1 and "was killed by SIGKILL: restarting every worker (restart 1 of 1)" in out1
    assert "restarting every worker (restart 1 of 1)" in out0, out  # node 0's worker stopped too, and restarted
    assert "restarted from step 5" in out0, out
    (resumed,) = _attempts(tmp_path)  # rank 0 writes an attempt's losses only when it ends normally
    assert resumed["attempt"] == 1 and resumed["steps"] == [6, 7, 8, 9, 10], resumed
    assert resumed["losses"] == [reference[s] for s in resumed["steps"]]  # bit-exact on CPU


def test_error_a_restart_repeats_is_not_retried(tmp_path: Path) -> None:
    code, out = _run(tmp_path, "--max_restarts=2", MB_FAULT="user_error:1:3")
    assert code == 2, out[-4000:]
    assert out.count("error (rank 1): bad-sample-on-rank-1") == 1, out[-4000:]  # one attempt
    assert "not restarting: " in out and "restarting every worker" not in out, out[-4000:]
    assert _attempts(tmp_path) == []


def _stop_with(run_dir: Path, sig: signal.Signals, after_step: int) -> tuple[int, str, int]:
    """Run until step ``after_step`` is logged, send ``sig`` to the launcher; (rc, output, step it stopped at)."""
    log = run_dir / f"log-{sig.name}.txt"
    run_dir.mkdir(parents=True, exist_ok=True)
    env = _env(run_dir, MB_STEP_SLEEP="0.3", MB_EXIT_SIGNAL=sig.name, MB_RESUME="1")
    with log.open("w") as out, reserved_port() as port:
        proc = subprocess.Popen(_cmd(port), cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + TIMEOUT_S
        while f"iteration {after_step:>6}/10" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.1)
        proc.send_signal(sig)
        code = proc.wait(timeout=TIMEOUT_S)
    attempt = _attempts(run_dir)[-1]
    assert attempt["exit_reason"] == "signal", attempt
    return code, log.read_text(), attempt["steps"][-1]


def test_stop_signals_save_at_one_step_and_the_next_start_resumes(tmp_path: Path,
                                                                   reference: dict[int, float]) -> None:
    code, out, stopped = _stop_with(tmp_path, signal.SIGUSR1, after_step=2)
    assert code == 0, out[-4000:]  # a clean end: the checkpoint step (below train_iters) says "start again"
    assert 2 <= stopped < 10 and (tmp_path / "checkpoints" / f"iter_{stopped:07d}").is_dir(), out[-4000:]
    assert out.count(f"training stopped at step {stopped} (signal)") == 1, out[-4000:]
    tracker = tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt"
    assert tracker.read_text().strip() == str(stopped), out[-4000:]  # what a batch script reads

    code, out, stopped_again = _stop_with(tmp_path, signal.SIGTERM, after_step=stopped + 1)
    assert code == 0, out[-4000:]
    assert f"loaded checkpoint {tmp_path / 'checkpoints' / f'iter_{stopped:07d}'}" in out, out[-4000:]
    assert stopped < stopped_again < 10 and (tmp_path / "checkpoints" / f"iter_{stopped_again:07d}").is_dir()

    code, out = _run(tmp_path, MB_RESUME="1")
    assert code == 0, out[-4000:]
    losses = {}
    for attempt in _attempts(tmp_path):
        losses.update(zip(attempt["steps"], attempt["losses"], strict=True))
    assert losses == reference  # every step once, with the uninterrupted run's loss (bit-exact on CPU)
