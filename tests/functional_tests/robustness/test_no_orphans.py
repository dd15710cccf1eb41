"""No orphans: stopping or killing the launcher (``run_recipe.py --nproc 2``) or torchrun itself leaves no worker
alive 10 s later."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron_bridge.utils.launch import reserved_port
from tests.functional_tests.launcher import REPO_ROOT


RUN_RECIPE = REPO_ROOT / "scripts" / "training" / "run_recipe.py"
GONE_WITHIN_S = 10


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _workers(marker: str) -> list[int]:
    """Pids of torchrun workers whose command line contains ``marker``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in cmdline and b"LOCAL_RANK=" in environ:
            pids.append(int(entry.name))
    return pids


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def _wait_training(proc: subprocess.Popen, log: Path, marker: str, n: int) -> list[int]:
    deadline = time.monotonic() + 300  # a loaded machine starts two ranks slowly
    while time.monotonic() < deadline:
        workers = _workers(marker)
        if len(workers) == n and "training 0.84M parameters" in log.read_text():
            return workers
        if proc.poll() is not None:
            pytest.fail(f"the job ended early:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the job did not start training:\n{log.read_text()[-3000:]}")


def _assert_all_gone(workers: list[int], log: Path) -> float:
    start = time.monotonic()
    while time.monotonic() - start < GONE_WITHIN_S:
        if not any(_alive(p) for p in workers):
            return time.monotonic() - start
        time.sleep(0.2)
    alive = [p for p in workers if _alive(p)]
    states = {p: _threads(p) for p in alive}  # before the kill: what each survivor was doing
    for p in alive:
        os.kill(p, signal.SIGKILL)
    pytest.fail(f"workers {alive} still alive {GONE_WITHIN_S}s after the launcher stopped (threads: {states})\n"
                f"{log.read_text()[-3000:]}")


def _threads(pid: int) -> list[str]:
    """Each thread of ``pid`` as "name state wchan" (what it waits in), for the failure message."""
    rows = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            name = (task / "comm").read_text().strip()
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = (task / "wchan").read_text().strip()
        except OSError:
            continue
        rows.append(f"{name} {state} {wchan}")
    return rows


def _run_args(tmp_path: Path) -> list[str]:
    return ["--recipe", "tiny_llama", "--dir", str(tmp_path / "run"), "train.train_iters=100000",
            "validation.eval_interval=null", "checkpoint.save=null"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_stopping_the_launcher_stops_the_workers(tmp_path, sig):
    log = tmp_path / "log.txt"
    proc = _start([sys.executable, str(RUN_RECIPE), "--nproc", "2", *_run_args(tmp_path)], log)
    workers = _wait_training(proc, log, str(tmp_path), 2)
    proc.send_signal(sig)
    _assert_all_gone(workers, log)
    proc.wait(timeout=60)
    if sig == signal.SIGTERM:  # the launcher waited for its job and reports the signal
        assert proc.returncode == 128 + signal.SIGTERM, log.read_text()[-3000:]


def test_killing_torchrun_stops_its_workers(tmp_path):
    log = tmp_path / "log.txt"
    with reserved_port() as port:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={port}", str(RUN_RECIPE), *_run_args(tmp_path)]
        proc = _start(cmd, log)
        workers = _wait_training(proc, log, str(tmp_path), 2)
        proc.send_signal(signal.SIGKILL)  # torchrun cannot forward anything: the workers' parent watch must act
        _assert_all_gone(workers, log)
        proc.wait(timeout=10)
