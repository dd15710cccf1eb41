"""Fail fast: an error (or a hang) on one rank ends the whole 2-rank job within seconds, the first error shown once.

The job runs ``worker.py`` under ``python -m megatron_bridge.launcher.torchrun`` (what ``run_recipe.py --nproc 2``
uses), started cold as users run it; its workers fork from the tests' fork server (launcher.py's
``forked_workers_env``: the same worker code, without each worker's cold imports). The hang case sets
``dist.distributed_timeout_seconds=20``.
"""

import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from megatron_bridge.utils.launch import reserved_port
from tests.functional_tests.launcher import REPO_ROOT, forked_workers_env
from tests.functional_tests.robustness.worker import HANG_TIMEOUT_S


WORKER = Path(__file__).with_name("worker.py")
LIMIT_S = 30


def run_job(mode: str, timeout: float = 300) -> tuple[int, str, float]:
    """(exit code, output, seconds from the start of training to the end of the job) of a 2-rank worker job.

    Seconds are counted from the "training ... parameters" log line (just before the failure at step 2), so a slow
    start on a loaded machine does not count against the limit."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "MB_FAIL_MODE": mode,
           **forked_workers_env()}  # the launcher starts cold, as users run it; its workers fork warm
    with reserved_port() as port:
        cmd = [sys.executable, "-m", "megatron_bridge.launcher.torchrun", "--nproc_per_node=2",
               "--master_addr=127.0.0.1", f"--master_port={port}", str(WORKER)]
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    end = datetime.now()
    out = proc.stdout + proc.stderr
    started = re.search(r"^\[(\S+ \S+) rank\d+\] INFO \S+: training [\d.]+M parameters", out, flags=re.M)
    assert started, out[-4000:]
    return proc.returncode, out, (end - datetime.strptime(started.group(1), "%Y-%m-%d %H:%M:%S,%f")).total_seconds()


def test_exception_on_one_rank_ends_the_job_fast():
    code, out, seconds = run_job("raise")
    assert seconds < LIMIT_S, f"took {seconds:.1f}s\n{out[-4000:]}"
    assert code == 1, out[-4000:]  # a crash: the worker's traceback, torchrun's exit code is the worker's
    assert out.count("boom-on-rank-1") == 1, out[-4000:]  # the original error, once
    assert "raised on rank 1 of 2" in out, out[-4000:]
    assert "ChildFailedError" not in out, out[-4000:]


def test_user_error_on_one_rank_is_one_line_and_exit_code_2():
    code, out, seconds = run_job("user_error")
    assert seconds < LIMIT_S, f"took {seconds:.1f}s\n{out[-4000:]}"
    assert code == 2, out[-4000:]
    assert out.count("bad-sample-on-rank-1") == 1, out[-4000:]
    assert "error (rank 1): bad-sample-on-rank-1" in out, out[-4000:]
    assert "Traceback" not in out, out[-4000:]


def test_hung_rank_is_bounded_by_the_collective_timeout():
    code, out, seconds = run_job("hang")
    assert seconds < HANG_TIMEOUT_S + LIMIT_S, f"took {seconds:.1f}s\n{out[-4000:]}"  # not the 10-minute default
    assert code == 3, out[-4000:]  # rank 0 stopped: its collective with the hung rank timed out
    assert "another rank failed" in out, out[-4000:]
