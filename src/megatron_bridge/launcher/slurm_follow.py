"""Following a Slurm run (launch.py ``--detach false``): stream each job's log, go on to the job it resubmitted
(:data:`~megatron_bridge.launcher.slurm.JOBS_FILE`), and end with the last job's exit code.

Bounded polling: ``scontrol -o show job`` every ``poll_s`` seconds, each call answered within
:data:`~megatron_bridge.launcher.slurm.CLIENT_TIMEOUT_S` or a named error. Without Slurm accounting (no ``sacct``)
a finished job stays visible for ``MinJobAge`` seconds (300 by default), far longer than one poll.
"""

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from megatron_bridge.launcher.slurm import JOBS_FILE, LOG_NAME, slurm_command
from megatron_bridge.utils.cli import say


ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
         "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT"}
"""Job states after which a job does not run again (a requeued job goes back to PENDING instead)."""


@dataclass(frozen=True)
class JobStatus:
    """A job's state and exit code as ``scontrol show job`` reports them."""

    state: str
    """``JobState``, e.g. RUNNING, COMPLETED, FAILED, TIMEOUT."""
    exit_code: int
    """The batch script's exit code (128 + N when signal N ended it; 0 only for COMPLETED)."""
    reason: str = "None"
    """``Reason``: why a pending job waits (Resources, Priority, Dependency, ...)."""
    nodes: str = ""
    """``NodeList`` of a job that runs (e.g. ``n[1-2]``)."""

    @property
    def ended(self) -> bool:
        """True once the job will not run again."""
        return self.state in ENDED


def job_status(job_id: str) -> JobStatus | None:
    """The job's status; None when Slurm no longer knows it."""
    proc = slurm_command(["scontrol", "-o", "show", "job", job_id])
    if proc.returncode != 0:
        return None
    fields = dict(f.split("=", 1) for f in proc.stdout.split() if "=" in f)
    state = fields.get("JobState", "UNKNOWN")
    code, _, sig = fields.get("ExitCode", "0:0").partition(":")
    exit_code = int(code) if code.isdigit() else 0
    if exit_code == 0 and sig.isdigit() and int(sig):
        exit_code = 128 + int(sig)
    if state != "COMPLETED" and exit_code == 0 and state in ENDED:
        exit_code = 1
    return JobStatus(state, exit_code, fields.get("Reason", "None"), fields.get("NodeList", ""))


def log_path(run_dir: Path, job_id: str) -> Path:
    """The log file of one job of the run."""
    return run_dir / LOG_NAME.replace("%j", job_id)


class LogTail:
    """Copies what was appended to a file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def copy(self, out: TextIO) -> bool:
        """Write the new bytes of the file (if it exists yet) to ``out``; True when there were any."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return False
        if data:
            self.offset += len(data)
            out.write(data.decode(errors="replace"))
            out.flush()
        return bool(data)


QUIET_S = 120.0
"""Seconds without new log output after which the follower says what it is waiting for (and again after as many)."""


def quiet_note(job_id: str, status: JobStatus, quiet_s: float) -> str:
    """What a follower waits for when a running job has been silent for ``quiet_s`` seconds."""
    where = f" on {status.nodes}" if status.nodes and status.nodes != "(null)" else ""
    return (f"Slurm job {job_id} is {status.state}{where}, no new output for {quiet_s:.0f} s: waiting for it to end "
            "(a silent node is stopped after --node_timeout seconds without a heartbeat; `scontrol show job "
            f"{job_id}` shows Slurm's view)")


def pending_reason(status: JobStatus) -> str:
    """`` (reason: Priority)`` for a job that waits for a reason Slurm names; "" when it names none (``None``)."""
    return "" if status.reason in ("None", "") else f" (reason: {status.reason})"


def run_jobs(run_dir: Path) -> list[tuple[str, str | None]]:
    """The run's jobs in submission order: ``(job id, the job that submitted it)`` (None for the first)."""
    try:
        lines = (run_dir / JOBS_FILE).read_text().splitlines()
    except FileNotFoundError:
        return []
    jobs = []
    for line in lines:
        words = line.split()
        if words and words[0].isdigit():
            jobs.append((words[0], words[2] if len(words) == 3 and words[1] == "after" else None))
    return jobs


def successor(run_dir: Path, job_id: str) -> str | None:
    """The job that ``job_id`` resubmitted (its line ``NEXT after JOB_ID`` in the run's jobs file), or None."""
    return next((job for job, parent in run_jobs(run_dir) if parent == job_id), None)


def follow(run_dir: Path, job_id: str, out: TextIO = sys.stdout, poll_s: float = 1.0,
           note: Callable[[str], None] = say, quiet_s: float = QUIET_S) -> int:
    """Follow the run from job ``job_id`` until its last job ends; returns that job's exit code."""
    while True:
        tail = LogTail(log_path(run_dir, job_id))
        try:
            status, seen, heard = job_status(job_id), None, time.monotonic()
            while status is not None and not status.ended:
                if status.state == "PENDING" and (status.state, status.reason) != seen:
                    note(f"Slurm job {job_id} is pending{pending_reason(status)}")
                seen = (status.state, status.reason)
                if tail.copy(out) or status.state == "PENDING":
                    heard = time.monotonic()
                elif time.monotonic() - heard >= quiet_s:
                    note(quiet_note(job_id, status, time.monotonic() - heard))
                    heard = time.monotonic()
                time.sleep(poll_s)
                status = job_status(job_id)
        except KeyboardInterrupt:
            note(f"stopped following: Slurm job {job_id} keeps running (its log: {tail.path}; stop it with "
                 f"`scancel {job_id}`)")
            raise
        time.sleep(min(poll_s, 0.5))  # the last lines of the log
        tail.copy(out)
        next_job = successor(run_dir, job_id)
        state = status.state if status is not None else "gone from Slurm's memory (MinJobAge)"
        if next_job is not None:
            note(f"Slurm job {job_id} {state}: following job {next_job}, which resumes the run")
            job_id = next_job
            continue
        code = status.exit_code if status is not None else 1
        note(f"Slurm job {job_id} {state} (exit code {code})")
        return code
