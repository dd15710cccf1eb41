"""A Slurm run's folder as the record of its jobs: which job holds it (one live job per folder), what each job did
(launch.py ``--status RUN_DIR``), and where to pick up following it (launch.py ``--follow RUN_DIR``).

The jobs file (:data:`~megatron_bridge.launcher.slurm.JOBS_FILE`) holds the first job's id, then one line
``NEXT after JOB`` per resubmission (:func:`~megatron_bridge.launcher.slurm_follow.run_jobs`); the sbatch script
holds the run's length and checkpoint folder; the checkpoint folder its progress.

Submitting takes the folder's lock file (:data:`LOCK_NAME`, ``flock``) from the live-job check until the jobs file
names the new job (:func:`submission`): two launches into one folder at the same instant (a brand-new folder
included) submit one job, and the other is refused naming it.
"""

import fcntl
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from megatron_bridge.errors import SlurmError
from megatron_bridge.launcher.slurm import JOBS_FILE, SCRIPT_NAME
from megatron_bridge.launcher.slurm_follow import JobStatus, job_status, log_path, run_jobs, successor
from megatron_bridge.utils.logging import get_logger, warn_once


logger = get_logger(__name__)

LOCK_NAME = ".submit.lock"
"""The run folder's submit lock (empty; kept after the submit)."""


def chain(run_dir: Path) -> list[str]:
    """The run's jobs from its first, each followed by the one it resubmitted."""
    jobs = run_jobs(run_dir)
    if not jobs:
        return []
    ids = [jobs[0][0]]
    while (next_job := successor(run_dir, ids[-1])) is not None and next_job not in ids:
        ids.append(next_job)
    return ids


def live_job(run_dir: Path) -> str | None:
    """A job of the run folder that is pending or running (the newest first), or None."""
    for job, _ in reversed(run_jobs(run_dir)):
        status = job_status(job)
        if status is not None and not status.ended:
            return job
    return None


def refuse_live_run(run_dir: Path) -> None:
    """A :class:`SlurmError` naming the job when a job of the run folder is still pending or running: a second
    submit would overwrite its script and jobs file and fight over its checkpoints (nothing is written here)."""
    job = live_job(run_dir)
    if job is not None:
        raise SlurmError(f"the run folder {run_dir} belongs to Slurm job {job}, which is still pending or running: "
                         f"follow it (launch.py --follow {run_dir}), wait for it to end, stop it (scancel {job}), or "
                         "give another --output_dir")


@contextmanager
def submission(run_dir: Path) -> Iterator[None]:
    """Hold the run folder's submit lock, refuse a live job (:func:`refuse_live_run`), and let the caller submit and
    record its job before the next launch into the folder may check. A file system without ``flock`` (some network
    mounts) warns once and submits without it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / LOCK_NAME).open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError as exc:
            warn_once(logger, "submit-lock", "no lock on %s (%s): two launches into this folder at the same "
                      "instant could both submit", run_dir / LOCK_NAME, exc)
        refuse_live_run(run_dir)
        yield  # the lock ends with the file's closing


def _script_value(run_dir: Path, name: str) -> str | None:
    try:
        m = re.search(rf"^{name}=(.*)$", (run_dir / SCRIPT_NAME).read_text(), re.M)
    except FileNotFoundError:
        return None
    return m.group(1).strip("'\"") if m else None


def checkpoint_progress(run_dir: Path) -> str:
    """``checkpoint step 4 of 10`` from the run's script and checkpoint folder ("no checkpoint yet" before one)."""
    folder, total = _script_value(run_dir, "CHECKPOINT_DIR"), _script_value(run_dir, "TRAIN_ITERS")
    try:
        step = (Path(folder) / "latest_checkpointed_iteration.txt").read_text().strip() if folder else ""
    except FileNotFoundError:
        step = ""
    return f"checkpoint step {step or 0} of {total or '?'}"


def describe_job(job: str, status: JobStatus | None) -> str:
    """``job 41: COMPLETED (exit code 0)`` / ``job 44: RUNNING`` / ``job 40: gone from Slurm's memory``."""
    if status is None:
        return f"job {job}: gone from Slurm's memory (MinJobAge; its log tells how it ended)"
    if status.ended:
        return f"job {job}: {status.state} (exit code {status.exit_code})"
    reason = f" (reason: {status.reason})" if status.state == "PENDING" and status.reason not in ("None", "") else ""
    return f"job {job}: {status.state}{reason}"


def status_report(run_dir: Path) -> list[str]:
    """launch.py ``--status``: one line per job of the run, its progress, its results; a :class:`SlurmError` for a
    folder that holds no Slurm run."""
    ids = chain(run_dir)
    if not ids:
        raise SlurmError(f"{run_dir} holds no Slurm run (no {JOBS_FILE}): give the --output_dir of a run submitted "
                         "with -a/-p")
    lines = [f"Slurm run {run_dir}: {len(ids)} job(s), {checkpoint_progress(run_dir)}"]
    lines += [f"  {describe_job(job, job_status(job))}, log {log_path(run_dir, job)}" for job in ids]
    results = run_dir / "results.json"
    lines.append(f"  results: {results}" if results.exists() else "  results: none yet")
    return lines


def job_to_follow(run_dir: Path) -> str:
    """The job ``--follow`` starts from: the first of the run's chain that has not ended, else its last."""
    ids = chain(run_dir)
    if not ids:
        raise SlurmError(f"{run_dir} holds no Slurm run (no {JOBS_FILE}): give the --output_dir of a run submitted "
                         "with -a/-p")
    for job in ids:
        status = job_status(job)
        if status is not None and not status.ended:
            return job
    return ids[-1]
