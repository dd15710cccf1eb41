"""Guarding a ``checkpoint.save`` folder: one writer at a time, nothing overwritten silently, no half-written saves
left behind, and a named error when the disk is full.

All functions here run on rank 0 (the manager calls them through :func:`~megatron_bridge.checkpoint.comm.run_on_rank0`
so every rank raises the same error).

* :func:`acquire_lock` writes ``run.lock`` (pid, host, start time; the Slurm job id under Slurm, so the Slurm
  launcher's script can remove a lock of an earlier, ended job of the same run) with ``O_EXCL``. A lock of a live
  process, or of another host, is a :class:`~megatron_bridge.errors.RunFolderLockedError` naming the holder; a lock
  whose pid is dead on this host is stale and taken over (logged). The same process may lock a folder again
  (several managers in one process, as tests do).
* :func:`check_overwrite` refuses to write into a folder that holds checkpoints this run did not resume from
  (another run's, or steps after the resumed one) unless ``checkpoint.overwrite`` is set, which deletes them.
* :func:`clean_interrupted_saves` removes ``.tmp-``/``.trash-`` folders of interrupted saves at start-up (they may
  be large: a restart after a full disk must not fail again at its first save).
* :func:`check_free_space` compares the expected size of a save with the free bytes; :func:`find_enospc` recognises
  "no space left on device" inside the errors DCP and the OS raise.
"""

import errno
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from megatron_bridge.checkpoint import files
from megatron_bridge.errors import (
    CheckpointError,
    CheckpointOverwriteError,
    DiskFullError,
    RunFolderLockedError,
)
from megatron_bridge.utils.atomic import pid_alive
from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)

LOCK_FILENAME = "run.lock"
"""The lock file of a ``checkpoint.save`` folder."""
LOCK_ATTEMPTS = 5
LOCK_RETRY_SECONDS = 0.2
"""An empty lock file is re-read this many times, this far apart (a job writes its record right after creating it)."""
DISK_MARGIN_BYTES = 16 << 20
"""Free space kept on top of the expected checkpoint size (manifest, trackers, file-system overhead)."""


# --------------------------------------------------------------------------------------------------------- lock
def _process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (Linux ``/proc``; None elsewhere): tells a reused pid from the holder."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _lock_record() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "process_start": _process_start(os.getpid()), "slurm_job_id": os.environ.get("SLURM_JOB_ID")}


def _holder_alive(holder: dict[str, Any]) -> bool:
    pid = holder.get("pid")
    if not isinstance(pid, int) or not pid_alive(pid):
        return False
    recorded = holder.get("process_start")
    return recorded is None or _process_start(pid) in (None, recorded)


def read_lock(root: str | Path) -> dict[str, Any] | None:
    """The lock record of ``root`` (None when unlocked; an unreadable lock reads as ``{}``)."""
    path = Path(root) / LOCK_FILENAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def acquire_lock(root: str | Path) -> None:
    """Lock ``root`` for this process (see the module docstring). Creates the folder.

    Raises:
        RunFolderLockedError: a live process (or a process on another host) holds the lock.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_FILENAME
    me = _lock_record()
    for attempt in range(LOCK_ATTEMPTS):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = read_lock(root)
            if holder is None:
                continue  # released meanwhile: try again
            if not isinstance(holder.get("pid"), int):  # empty or not a lock record: its writer may be writing it
                if attempt + 1 < LOCK_ATTEMPTS:
                    time.sleep(LOCK_RETRY_SECONDS)
                    continue
                raise RunFolderLockedError(
                    f"checkpoint.save={str(root)!r} has a lock file {str(path)!r} that is empty or unreadable (not a "
                    f"lock record of pid, host and start time: {_lock_excerpt(path)}); its writer may have been "
                    "killed while writing it. If no job writes to this folder, delete the file") from None
            if holder.get("pid") == me["pid"] and holder.get("host") == me["host"]:
                return  # this process holds it already
            pid, host = holder.get("pid"), holder.get("host")
            if host == me["host"] and not _holder_alive(holder):
                logger.warning("checkpoint folder %s: taking over the stale lock of pid %d (started %s), which is "
                               "no longer running", root, pid, holder.get("started", "?"))
                path.unlink(missing_ok=True)
                continue
            raise RunFolderLockedError(
                f"checkpoint.save={str(root)!r} is locked by pid {pid} on host {host} (started "
                f"{holder.get('started', '?')}): another job is writing there. Stop that job or pick another "
                f"checkpoint.save folder; if that job is gone, delete {str(path)!r}"
            ) from None
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        return
    raise RunFolderLockedError(f"could not lock {str(path)!r}: it keeps changing (another job is starting there?)")


def _lock_excerpt(path: Path) -> str:
    try:
        content = path.read_bytes()
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    return f"{len(content)} bytes" + (f", starting {content[:40]!r}" if content else "")


def release_lock(root: str | Path) -> None:
    """Remove the lock of ``root`` if this process holds it."""
    holder = read_lock(root)
    if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        (Path(root) / LOCK_FILENAME).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------- overwrite
def check_overwrite(root: str | Path, resumed_step: int | None, overwrite: bool) -> list[int]:
    """Refuse (or with ``overwrite``, delete) checkpoints in ``root`` this run did not resume from.

    ``resumed_step``: the step this run loaded from ``root`` itself (None: it did not resume from ``root``). Foreign
    checkpoints are all of them when it did not, else those after ``resumed_step`` up to the trackers' step (an
    ``iter_*`` folder beyond the trackers is a save killed between its commit and the tracker update: the run
    replaces it). Returns the deleted steps.

    Raises:
        CheckpointOverwriteError: there are foreign checkpoints and ``overwrite`` is False.
    """
    from megatron_bridge.checkpoint.load import latest_step

    steps = files.list_checkpoints(root)
    if resumed_step is None:
        foreign = steps
    else:
        tracked = latest_step(root)
        foreign = [s for s in steps if resumed_step < s <= max(tracked or 0, resumed_step)]
    if not foreign:
        return []
    if not overwrite:
        why = (f"this run resumed from step {resumed_step}, and saving would overwrite the later steps "
               f"{foreign} and move the tracker back" if resumed_step is not None else
               f"this run did not resume from them (set checkpoint.load={str(root)!r} to continue that run)")
        raise CheckpointOverwriteError(
            f"checkpoint.save={str(root)!r} already holds checkpoints of steps {foreign}; {why}. Use another "
            "checkpoint.save folder, or set checkpoint.overwrite=True to delete them"
        )
    logger.warning("checkpoint.overwrite=True: deleting checkpoints of steps %s in %s that this run did not resume "
                   "from", foreign, root)
    for step in foreign:
        files.remove_checkpoint(files.iteration_dir(root, step))
    tracker = files.read_tracker_step(root)
    if tracker is not None and tracker in foreign:
        for name in (files.TRACKER_FILENAME, files.LATEST_TRAIN_STATE_FILENAME):
            (Path(root) / name).unlink(missing_ok=True)
        if resumed_step is not None:
            files.write_trackers(root, resumed_step, (files.iteration_dir(root, resumed_step) /
                                                       files.TRAIN_STATE_FILENAME).read_bytes())
    return foreign


def clean_interrupted_saves(root: str | Path) -> list[str]:
    """Remove the ``.tmp-``/``.trash-`` folders of interrupted saves (call with the lock held)."""
    return files.remove_stale_folders(root)


# ---------------------------------------------------------------------------------------------------- disk full
def committed_size(root: str | Path) -> int | None:
    """Bytes of the newest committed checkpoint in ``root`` per its manifest (None when there is none)."""
    steps = files.list_checkpoints(root)
    if not steps:
        return None
    try:
        manifest = files.read_manifest(files.iteration_dir(root, steps[-1]))
    except CheckpointError:
        return None
    return sum(int(entry.get("size", 0)) for entry in manifest["files"].values())


def disk_full_message(root: str | Path, needed: int | None, free: int | None) -> str:
    """The text of a :class:`DiskFullError` for ``root``."""
    need = f"about {needed:,} bytes" if needed else "more space"
    have = f"; {free:,} bytes are free" if free is not None else ""
    return (f"not enough disk space to save a checkpoint in {str(root)!r}: it needs {need}{have}. The previous "
            "checkpoint is intact; free space (or lower checkpoint.most_recent_k, or save elsewhere) and restart")


def check_free_space(root: str | Path, needed: int) -> None:
    """Raise :class:`DiskFullError` when ``root``'s file system has less than ``needed`` + a margin bytes free."""
    free = shutil.disk_usage(root).free
    if free < needed + DISK_MARGIN_BYTES:
        raise DiskFullError(disk_full_message(root, needed + DISK_MARGIN_BYTES, free))


def find_enospc(exc: BaseException | None) -> bool:
    """True when ``exc`` (or its causes, or the per-rank failures of a DCP CheckpointException) is an ENOSPC."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(e):
            return True
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            stack.extend(v[0] if isinstance(v, tuple) else v for v in failures.values())
        stack.extend([e.__cause__, e.__context__])
    return False
