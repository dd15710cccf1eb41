"""Run a functional test under ``torch.distributed.run`` from plain pytest.

Pattern (see tests/functional_tests/training/test_pretrain_backends.py)::

    def test_something():
        if not is_worker():
            launch(f"{__file__}::test_something", nproc=2)
            return
        ...  # runs on every rank under torchrun, with the process group set up by the code under test

Under torchrun, tests/functional_tests/conftest.py tears the process group down after each test and ends each worker
with ``os._exit`` after pytest printed its summary: torch 2.13's gloo aborts at interpreter teardown in ~10% of runs
otherwise. Every launch has a timeout and its own free port.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


REPO_ROOT = Path(__file__).resolve().parents[2]


def is_worker() -> bool:
    """True inside a process started by torch.distributed.run."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_WORLD_SIZE" in os.environ


def free_port() -> int:
    """A free TCP port on localhost (each launch uses its own, so parallel sessions do not collide)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(nodeid: str, *, nproc: int = 2, timeout: float = 420, env: dict[str, str] | None = None) -> str:
    """Run pytest ``nodeid`` on ``nproc`` ranks; fail the calling test with the output tail unless all pass."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        "-m", "pytest", nodeid, "-q", "-s", "-p", "no:cacheprovider", "-x",
    ]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")[-6000:] if isinstance(exc.stdout, bytes) else (exc.stdout or "")[-6000:]
        pytest.fail(f"{nodeid} on {nproc} ranks timed out after {timeout}s\n{out}")
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"{nodeid} on {nproc} ranks failed (exit {proc.returncode}):\n{output[-8000:]}")
    if " passed" not in output:
        pytest.fail(f"{nodeid} on {nproc} ranks ran no test:\n{output[-4000:]}")
    return output
