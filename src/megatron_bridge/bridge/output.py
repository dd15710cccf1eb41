"""Output folders that appear whole or not at all: everything is written into a hidden sibling folder, fsynced,
then renamed into place. A failure (bad input found half-way, disk full, Ctrl-C) removes the partial folder."""

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from megatron_bridge.checkpoint.files import fsync_dir, fsync_tree
from megatron_bridge.errors import BridgeError


@contextmanager
def staged_output_dir(dst: str | Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder; on success it becomes ``dst`` (an existing ``dst`` is replaced only with
    ``overwrite``); on any exception it is removed and ``dst`` is left as it was."""
    dst = Path(dst)
    if dst.exists() and not (dst.is_dir() and not any(dst.iterdir())) and not overwrite:
        raise BridgeError(f"output {str(dst)!r} already exists and is not empty; choose a new path or pass "
                          "overwrite=True (--overwrite)")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.parent / f".{dst.name}.tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        yield tmp
        fsync_tree(tmp)
        trash = None
        if dst.exists():
            trash = dst.parent / f".{dst.name}.trash-{uuid.uuid4().hex[:12]}"
            os.rename(dst, trash)
        os.rename(tmp, dst)
        fsync_dir(dst.parent)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
