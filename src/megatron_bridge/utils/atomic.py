"""Outputs that appear complete or not at all: write to a temporary sibling, then ``os.replace`` it into place.

Used by preprocessing (the ``.bin``/``.idx`` pair) and the weight converter (a file or a Hugging Face folder); the
checkpoint commit has its own, stricter sequence (``checkpoint/files.py``).
"""

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def temporary_sibling(path: str | Path) -> Path:
    """A fresh hidden name next to ``path``: ``.<name>.tmp-<id>``."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:12]}")


def owned_temporary_sibling(path: str | Path) -> Path:
    """A fresh hidden name next to ``path`` that records this process: ``.<name>.tmp-<pid>-<id>`` (see
    :func:`remove_stale_temporaries`)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (another user's live process counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Remove the :func:`owned_temporary_sibling` files of ``path`` whose process is gone (a killed writer on this
    host); the temporaries of live writers stay. Returns what was removed."""
    path = Path(path)
    removed = []
    for tmp in path.parent.glob(f".{path.name}.tmp-*-*") if path.parent.is_dir() else ():
        pid = tmp.name[len(f".{path.name}.tmp-"):].split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            remove_path(tmp)
            removed.append(tmp)
    return removed


def remove_path(path: str | Path) -> None:
    """Delete a file or a folder tree if it exists."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def publish(tmp: str | Path, final: str | Path) -> None:
    """Move a complete ``tmp`` (file or folder) to ``final``, replacing what is there (a folder is renamed aside
    first and removed after, as ``os.replace`` cannot replace a non-empty folder)."""
    tmp, final = Path(tmp), Path(final)
    if final.is_dir() and not final.is_symlink():
        old = temporary_sibling(final)
        os.rename(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


@contextmanager
def atomic_output(final: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write ``final`` into; on success it replaces ``final``, on any error it is removed
    and ``final`` is untouched."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(final)
    try:
        yield tmp
    except BaseException:
        remove_path(tmp)
        raise
    publish(tmp, final)
