"""Checks of paths a user gives for outputs and inputs, before anything is written: a path under a regular file, in
a kernel file system (``/proc``, ``/sys``, ``/dev``), or a file where a folder is needed (and the reverse) is named
with the reason, instead of failing deep inside a run with ``NotADirectoryError``. Pure ``os.path`` (no torch)."""

import os
import stat
from pathlib import Path

from megatron_bridge.errors import PathError


KERNEL_FILE_SYSTEMS = ("/proc", "/sys", "/dev")
"""Folders whose files are the kernel's, not storage: never an output."""


def describe_path(path: str | Path) -> str:
    """What ``path`` is, in words: "missing", "a broken symbolic link", "a folder", "a FIFO (named pipe)", "a
    socket", "a character device", "a block device", "a regular file" or "a regular file that is not readable"."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        return "a broken symbolic link" if p.is_symlink() else "missing"
    except NotADirectoryError:
        return "missing (a parent of it is a file, not a folder)"
    except PermissionError:
        return "not reachable (a parent folder is not readable)"
    for test, words in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                        (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device")):
        if test(mode):
            return words
    return "a regular file" if os.access(p, os.R_OK) else "a regular file that is not readable"


def file_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be read as a file, as a predicate ("does not exist", "is a folder, not a file", "is a FIFO
    (named pipe), not a regular file", "is a regular file that is not readable"), or None when it can."""
    p = Path(path)
    if p.is_file() and os.access(p, os.R_OK):
        return None
    what = describe_path(p)
    if what.startswith("missing"):
        return "does not exist" + what[len("missing"):]
    if what.startswith("a regular file"):
        return f"is {what}"
    return f"is {what}, not a regular file" if what != "a folder" else "is a folder, not a file"


def output_path_problem(path: str | Path, *, folder: bool) -> str | None:
    """Why ``path`` cannot be written as an output folder (``folder=True``) or file, or None when it can (it may
    not exist yet: its nearest existing ancestor must be a writable folder)."""
    p = Path(os.path.abspath(os.path.expanduser(str(path))))
    kernel = next((k for k in KERNEL_FILE_SYSTEMS if p == Path(k) or Path(k) in p.parents), None)
    if kernel is not None:
        return f"it is in {kernel}, a kernel file system, not storage: pick a folder on a disk"
    if p.exists():
        if folder and not p.is_dir():
            return "it is a file, not a folder"
        if not folder and p.is_dir():
            return "it is a folder, not a file"
        return None if os.access(p, os.W_OK) else "it is not writable"
    ancestor = next(a for a in p.parents if a.exists())
    if not ancestor.is_dir():
        return f"{str(ancestor)!r} is a file, not a folder, so nothing can be created under it"
    return None if os.access(ancestor, os.W_OK | os.X_OK) else f"{str(ancestor)!r} is not writable"


def check_output_path(path: str | Path, what: str, *, folder: bool = True) -> Path:
    """``path`` if it can be written as an output (see :func:`output_path_problem`).

    Raises:
        PathError: naming ``what`` (the flag or config field), the path and why.
    """
    problem = output_path_problem(path, folder=folder)
    if problem:
        raise PathError(f"{what}={str(path)!r} cannot be written: {problem}")
    return Path(path)


def check_input_file(path: str | Path, what: str) -> Path:
    """``path`` if it is a readable regular file.

    Raises:
        PathError: naming ``what``, the path and why (missing, a folder, in a kernel file system, unreadable).
    """
    p = Path(path)
    absolute = Path(os.path.abspath(str(p)))
    if any(absolute == Path(k) or Path(k) in absolute.parents for k in KERNEL_FILE_SYSTEMS):
        why = "it is in a kernel file system, not a file written by this library"
    elif not p.is_file() or not os.access(p, os.R_OK):
        why = f"it is {describe_path(p)}" if p.exists() or p.is_symlink() else "it does not exist"
    else:
        return p
    raise PathError(f"{what}={str(path)!r} cannot be read: {why}")
