"""The files of a checkpoint folder (names, trackers, manifest) and the crash-safe commit that publishes a new
checkpoint.

::

    <save>/
        latest_checkpointed_iteration.txt   # the newest committed step, as text (Megatron-LM compatible)
        latest_train_state.pt               # copy of the newest iter_*/train_state.pt (read first at resume)
        iter_0000010/                       # one committed checkpoint per saved step
            .metadata  __0_0.distcp ...     # DCP shards (torch_dist, fsdp_dtensor) or model_optim.pt (torch)
            rng_rank_00000.pt ...           # RNG states, one file per rank
            train_state.pt  run_config.yaml
            manifest.json                   # written last: size and crc32 of every other file
        iter_0000020.tmp-<id>/              # a save in progress (or one killed mid-way): never read, cleaned later

A save writes everything into a ``.tmp-<id>`` folder, fsyncs files and folder, then rank 0 writes the manifest,
renames the folder to ``iter_NNNNNNN`` and only then replaces the trackers (write temp + fsync + ``os.replace``).
A process killed at any moment therefore leaves the previous tracker pointing at a complete checkpoint.
"""

import json
import os
import re
import shutil
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

from megatron_bridge.errors import CheckpointError
from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)

TRACKER_FILENAME = "latest_checkpointed_iteration.txt"
LATEST_TRAIN_STATE_FILENAME = "latest_train_state.pt"
TRAIN_STATE_FILENAME = "train_state.pt"
RUN_CONFIG_FILENAME = "run_config.yaml"
MANIFEST_FILENAME = "manifest.json"
DCP_METADATA_FILENAME = ".metadata"
TORCH_FILENAME = "model_optim.pt"
MANIFEST_VERSION = 1

_ITER_RE = re.compile(r"^iter_(\d{7,})$")
_STALE_RE = re.compile(r"^(iter_\d{7,}\.(tmp|trash)|\.converted)-[0-9a-f]+$")
"""An interrupted save's temporary or trash folder, or the copy a load converted for the other engine
(:func:`conversion_dir`; removed once loaded)."""
_CHUNK = 1 << 22

PAUSE_ENV = "MEGATRON_BRIDGE_CKPT_PAUSE_AT"
"""Test hook: name of a save stage (see :func:`fault_point`) at which the saver stops and sleeps."""
PAUSE_MARKER_ENV = "MEGATRON_BRIDGE_CKPT_PAUSE_MARKER"
"""Test hook: file that receives ``"<stage> <pid>"`` when the saver reaches the stage named by ``PAUSE_ENV``."""


# ------------------------------------------------------------------------------------------------------ names
def iteration_dirname(step: int) -> str:
    """Folder name of the checkpoint of ``step``: ``iter_0000010``."""
    return f"iter_{step:07d}"


def iteration_dir(root: str | Path, step: int) -> Path:
    """Path of the committed checkpoint of ``step`` under ``root``."""
    return Path(root) / iteration_dirname(step)


def temporary_dir(root: str | Path, step: int, save_id: str) -> Path:
    """Path a save of ``step`` writes into before it is committed."""
    return Path(root) / f"{iteration_dirname(step)}.tmp-{save_id}"


def conversion_dir(root: str | Path) -> Path:
    """A fresh folder name under ``root`` for a source converted on the fly for the other engine (removed after the
    load; one left by a killed run is removed with the interrupted saves)."""
    return Path(root) / f".converted-{new_save_id()}"


def new_save_id() -> str:
    """A fresh id for a temporary folder (hex, so stale-folder cleanup can recognize it)."""
    return uuid.uuid4().hex[:12]


def step_of(folder: str | Path) -> int | None:
    """The step of a committed ``iter_NNNNNNN`` folder name, else None."""
    match = _ITER_RE.match(Path(folder).name)
    return int(match.group(1)) if match else None


def list_checkpoints(root: str | Path) -> list[int]:
    """Steps of the committed checkpoints (folders with a manifest) under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    steps = []
    for entry in root.iterdir():
        step = step_of(entry)
        if step is not None and (entry / MANIFEST_FILENAME).is_file():
            steps.append(step)
    return sorted(steps)


# ------------------------------------------------------------------------------------------------- durability
def fsync_file(path: str | Path) -> None:
    """Flush a file's data to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    """Flush a folder's entries (new, renamed and deleted names) to stable storage."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: str | Path) -> None:
    """fsync every file under ``folder`` and every folder, deepest first."""
    for dirpath, _, filenames in os.walk(folder, topdown=False):
        for name in filenames:
            fsync_file(os.path.join(dirpath, name))
        fsync_dir(dirpath)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: write a temp file, fsync it, ``os.replace``, fsync the folder."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{new_save_id()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fault_point(stage: str) -> None:
    """Test hook: when ``$MEGATRON_BRIDGE_CKPT_PAUSE_AT`` names ``stage``, mark it reached and sleep (to be killed).

    Stages, in save order: ``rank_files_written`` (temp folder with this rank's RNG file, before the DCP write),
    ``shards_written`` (all files in the temp folder, fsynced), ``manifest_written``,
    ``renamed`` (iter folder committed, trackers not yet), ``train_state_tracker`` (latest_train_state.pt
    replaced, the .txt tracker not yet), ``trackers_written`` (before most_recent_k cleanup).
    """
    if os.environ.get(PAUSE_ENV) != stage:
        return
    marker = os.environ.get(PAUSE_MARKER_ENV)
    if marker:
        atomic_write_bytes(marker, f"{stage} {os.getpid()}".encode())
    logger.warning("checkpoint save paused at stage %r (%s is set)", stage, PAUSE_ENV)
    while True:
        time.sleep(3600)


# ---------------------------------------------------------------------------------------------------- manifest
def file_crc32(path: str | Path) -> str:
    """crc32 of a file's bytes, as 8 hex digits."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc & 0xFFFFFFFF:08x}"


def write_manifest(folder: str | Path, info: dict[str, Any]) -> None:
    """Write ``manifest.json``: ``info`` plus the size and crc32 of every file in ``folder`` (durably)."""
    folder = Path(folder)
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel != MANIFEST_FILENAME:
            files[rel] = {"size": path.stat().st_size, "crc32": file_crc32(path)}
    manifest = {"version": MANIFEST_VERSION, **info, "files": files}
    atomic_write_bytes(folder / MANIFEST_FILENAME, json.dumps(manifest, indent=1, sort_keys=True).encode())


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """Parse ``manifest.json`` of a checkpoint folder; CheckpointError when it is missing or malformed."""
    path = Path(folder) / MANIFEST_FILENAME
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {str(folder)!r} has no {MANIFEST_FILENAME}: it is incomplete (a save was interrupted) or "
            "was not written by megatron_bridge"
        )
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{str(path)!r} is not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{str(path)!r} is malformed: expected an object with a 'files' table")
    return manifest


def verify_manifest(folder: str | Path, *, checksums: bool = True) -> dict[str, Any]:
    """Check every file listed in the manifest exists with its size (and crc32); returns the manifest.

    Raises:
        CheckpointError: the manifest is missing or malformed, or a file is missing, truncated or corrupt.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    for rel, entry in manifest["files"].items():
        path = folder / rel
        if not path.is_file():
            raise CheckpointError(f"checkpoint {str(folder)!r} is missing file {rel!r} listed in its manifest")
        size = path.stat().st_size
        if size != entry.get("size"):
            raise CheckpointError(
                f"checkpoint file {str(path)!r} has size {size} but the manifest says {entry.get('size')} "
                "(truncated or overwritten)"
            )
        if checksums and file_crc32(path) != entry.get("crc32"):
            raise CheckpointError(f"checkpoint file {str(path)!r} fails its crc32 check (corrupt)")
    return manifest


# ------------------------------------------------------------------------------------------------------ commit
def commit(tmp: str | Path, final: str | Path, info: dict[str, Any]) -> None:
    """Publish a fully written temp folder as ``final`` (rank 0 only, after every rank's files are durable).

    Writes the manifest, fsyncs the tree, then renames. An existing ``final`` (a re-save of the same step) is
    first renamed to a ``.trash-<id>`` folder and removed afterwards.
    """
    tmp, final = Path(tmp), Path(final)
    fsync_tree(tmp)
    fault_point("shards_written")
    write_manifest(tmp, info)
    fault_point("manifest_written")
    trash = None
    if final.exists():
        trash = final.with_name(f"{final.name}.trash-{new_save_id()}")
        os.rename(final, trash)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
    fault_point("renamed")


def write_trackers(root: str | Path, step: int, train_state_bytes: bytes) -> None:
    """Point the trackers at ``step``: ``latest_train_state.pt`` first, then the .txt tracker (each atomic)."""
    root = Path(root)
    atomic_write_bytes(root / LATEST_TRAIN_STATE_FILENAME, train_state_bytes)
    fault_point("train_state_tracker")
    atomic_write_bytes(root / TRACKER_FILENAME, f"{step}\n".encode())
    fault_point("trackers_written")


def read_tracker_step(root: str | Path) -> int | None:
    """The step in ``latest_checkpointed_iteration.txt``; None when the file does not exist."""
    path = Path(root) / TRACKER_FILENAME
    if not path.is_file():
        return None
    try:
        text = path.read_bytes().decode("utf-8").strip()
    except UnicodeDecodeError:
        raise CheckpointError(
            f"{str(path)!r} should hold a step number but holds bytes that are not text ({path.read_bytes()[:40]!r}). "
            f"Fix: set checkpoint.ckpt_step to one of the committed steps {list_checkpoints(root)}, or write one of "
            "them into the file") from None
    if text == "release":
        raise CheckpointError(f"{str(path)!r} says 'release': release checkpoints are not supported")
    if not (text.isascii() and text.isdigit()):
        raise CheckpointError(
            f"{str(path)!r} should hold a step number but holds {text[:40]!r}. Fix: set checkpoint.ckpt_step to one "
            f"of the committed steps {list_checkpoints(root)}, or write one of them into the file")
    return int(text)


# ----------------------------------------------------------------------------------------------------- cleanup
def remove_checkpoint(folder: str | Path) -> None:
    """Delete a committed checkpoint folder crash-safely (rename to ``.trash-<id>`` first, then remove)."""
    folder = Path(folder)
    trash = folder.with_name(f"{folder.name}.trash-{new_save_id()}")
    os.rename(folder, trash)
    fsync_dir(folder.parent)
    shutil.rmtree(trash, ignore_errors=True)


def keep_most_recent(root: str | Path, k: int, protect: int | None = None) -> list[int]:
    """Delete the oldest committed checkpoints so that exactly ``k`` remain (``k=-1`` keeps all).

    ``protect`` (the step the trackers point at) is never deleted. Returns the deleted steps.
    """
    if k < 0:
        return []
    steps = list_checkpoints(root)
    doomed = [s for s in steps[: max(len(steps) - k, 0)] if s != protect]
    for step in doomed:
        remove_checkpoint(iteration_dir(root, step))
    if doomed:
        logger.info("most_recent_k=%d: removed checkpoints of steps %s", k, doomed)
    return doomed


def is_stale_folder(path: str | Path) -> bool:
    """True for a ``.tmp-<id>`` or ``.trash-<id>`` folder of an interrupted save, or a ``.converted-<id>`` copy."""
    return Path(path).is_dir() and _STALE_RE.match(Path(path).name) is not None


def remove_stale_folders(root: str | Path) -> list[str]:
    """Remove ``.tmp-<id>`` and ``.trash-<id>`` folders left by interrupted saves (and ``.converted-<id>`` copies
    left by an interrupted load). Returns their names."""
    root = Path(root)
    if not root.is_dir():
        return []
    stale = [p for p in root.iterdir() if p.is_dir() and _STALE_RE.match(p.name)]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    if stale:
        logger.info("removed %d folder(s) of interrupted checkpoint saves in %s", len(stale), root)
    return [p.name for p in stale]
