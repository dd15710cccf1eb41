"""The few collectives checkpointing needs, over its own gloo process group; no-ops in a single process.

Checkpoint I/O runs on a dedicated gloo group: DCP's async save coordinates ranks from a background thread, which
must not interleave with the training loop's collectives on the default group, and DCP needs a CPU backend for
staging even when training uses NCCL.
"""

import errno
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch.distributed as dist

from megatron_bridge.errors import CheckpointError, CheckpointOverwriteError, DiskFullError, RunFolderLockedError


T = TypeVar("T")


def is_distributed() -> bool:
    """True when a process group is initialized."""
    return dist.is_available() and dist.is_initialized()


def new_checkpoint_group() -> dist.ProcessGroup | None:
    """A gloo group over all ranks (collective: every rank must call it at the same point); None without one. Releases
    the groups retired before (``megatron_bridge.distributed.init.release_retired_groups``)."""
    if not is_distributed():
        return None
    from megatron_bridge.distributed.failure import world_timeout
    from megatron_bridge.distributed.init import release_retired_groups

    release_retired_groups()
    return dist.new_group(backend="gloo", timeout=world_timeout())


def retire_checkpoint_group(group: dist.ProcessGroup | None) -> None:
    """Destroy ``group``, a :func:`new_checkpoint_group` nothing uses any more (idempotent; every rank calls it;
    ``megatron_bridge.distributed.init.retire_groups``). Each checkpoint manager and weights load makes its own:
    without this, every ``pretrain()`` in a process that keeps its default group (a notebook, a test launch) would
    leave one behind, with its sockets and a gloo thread waking every 10 ms."""
    if group is not None:
        from megatron_bridge.distributed.init import retire_groups

        retire_groups([group])


@contextmanager
def checkpoint_group() -> Iterator[dist.ProcessGroup | None]:
    """:func:`new_checkpoint_group` for the block, retired after it."""
    group = new_checkpoint_group()
    try:
        yield group
    finally:
        retire_checkpoint_group(group)


def rank() -> int:
    """Global rank (0 without a process group)."""
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    """Global world size (1 without a process group)."""
    return dist.get_world_size() if is_distributed() else 1


def barrier(group: dist.ProcessGroup | None) -> None:
    """Barrier over ``group`` (no-op in a single process)."""
    if is_distributed():
        dist.barrier(group=group)


def broadcast_from_rank0(value: T, group: dist.ProcessGroup | None) -> T:
    """Rank 0's ``value`` on every rank."""
    if not is_distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


_ERRORS: dict[str, type[CheckpointError]] = {
    cls.__name__: cls for cls in (CheckpointError, RunFolderLockedError, CheckpointOverwriteError, DiskFullError)
}


def run_on_rank0(fn: Callable[[], T], group: dist.ProcessGroup | None) -> T:
    """Run ``fn`` on rank 0 and give its result to every rank; a CheckpointError (of any subclass) or OSError it
    raises is raised on every rank, as the same CheckpointError class (an OSError as a CheckpointError, or a
    DiskFullError for "no space left"), so no rank waits forever for a failed rank 0."""
    result: Any = None
    error: tuple[str, str] | None = None
    if rank() == 0:
        try:
            result = fn()
        except CheckpointError as exc:
            error = (type(exc).__name__, str(exc))
        except OSError as exc:
            error = ("CheckpointError", f"checkpoint file operation failed: {exc}")
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                error = ("DiskFullError", f"no space left on the device while writing a checkpoint: {exc}")
    result, error = broadcast_from_rank0((result, error), group)
    if error is not None:
        raise _ERRORS.get(error[0], CheckpointError)(error[1])
    return result


def all_ok(ok: bool, group: dist.ProcessGroup | None) -> bool:
    """True when ``ok`` is True on every rank."""
    if not is_distributed():
        return ok
    flags: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(flags, bool(ok), group=group)
    return all(flags)
