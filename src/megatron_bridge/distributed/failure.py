"""What a rank does when training fails: report the error once, abort the process groups, never wait on peers.

When one rank raises, the others are usually blocked in a collective that now can never complete. The failing rank
therefore must not enter another collective (no barrier, no pending-save wait): :func:`abort_distributed` aborts
every process group, which closes its connections, so the peers' pending collectives fail at once ("Connection
closed by peer" with gloo) instead of hanging for ``dist.distributed_timeout_minutes``. Those peers then recognise
their error as a consequence (:func:`is_peer_failure`, :func:`annotate_failure`), so the CLI shows the first error
once and the consequences as one line each.
"""

from datetime import timedelta
from typing import TYPE_CHECKING

from megatron_bridge.utils.dist_env import node_index
from megatron_bridge.utils.logging import get_logger


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

logger = get_logger(__name__)

_PEER_FAILURE_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "remote worker crashing",
    "broken pipe",
    "timed out",
    "timeout",
    "socket closed",
    "process group has been aborted",
    "has been destroyed",
    "not been initialized",
)


def collective_timeout(cfg: "ConfigContainer") -> timedelta:
    """How long a collective may wait for the other ranks: ``dist.distributed_timeout_seconds`` when set, else
    ``dist.distributed_timeout_minutes``."""
    seconds = cfg.dist.distributed_timeout_seconds
    if seconds is not None:
        return timedelta(seconds=seconds)
    return timedelta(minutes=cfg.dist.distributed_timeout_minutes)


def is_peer_failure(exc: BaseException) -> bool:
    """True for errors that mean "another rank stopped" (a collective lost its peer or timed out)."""
    import torch.distributed as dist

    kinds = tuple(k for k in (getattr(dist, "DistBackendError", None), getattr(dist, "DistNetworkError", None),
                              getattr(dist, "DistStoreError", None)) if k is not None)
    if kinds and isinstance(exc, kinds):
        return True
    if type(exc) is not RuntimeError:  # gloo raises plain RuntimeErrors; project errors are never peer failures
        return False
    text = str(exc).lower()
    return any(marker in text for marker in _PEER_FAILURE_MARKERS)


def annotate_failure(exc: BaseException, rank: int, world_size: int) -> None:
    """Record on ``exc`` the rank it was raised on (``exc.rank``, and a note shown with tracebacks); a peer-failure
    consequence also gets a note pointing at the rank that failed first. Nothing is logged: the error is shown once,
    by whoever handles it (the CLI prints one line, see :mod:`megatron_bridge.utils.cli`)."""
    if world_size <= 1 or getattr(exc, "rank", None) is not None:
        return
    try:
        exc.rank = rank  # type: ignore[attr-defined]
    except AttributeError:  # exceptions with __slots__
        return
    node = node_index()
    where = f"rank {rank} of {world_size}" + (f", node {node}" if node is not None else "")
    if is_peer_failure(exc):
        exc.peer_failure = True  # type: ignore[attr-defined]
        exc.add_note(f"(on {where}: a collective failed because another rank stopped; the first error is in that "
                     "rank's output)")
    else:
        exc.add_note(f"(raised on {where})")


def abort_distributed() -> None:
    """Abort every process group without a barrier (safe after a failure; a no-op without a process group).

    Pending collectives of the peers fail immediately instead of waiting for the timeout. Errors while aborting are
    logged at debug level and ignored: the process is on its way out.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        dist.distributed_c10d._abort_process_group()  # experimental torch API: aborts all groups, gloo and nccl
    except (RuntimeError, ValueError, AttributeError, NotImplementedError) as exc:
        logger.debug("aborting the process groups failed (%s); destroying them instead", exc)
        try:
            dist.destroy_process_group()
        except (RuntimeError, ValueError) as exc2:
            logger.debug("destroying the process groups failed: %s", exc2)


def world_timeout() -> timedelta | None:
    """The collective timeout of the default process group (None when unknown), for groups created later: a
    ``new_group`` without a timeout would otherwise wait torch's default 30 minutes."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:  # private torch API; falls back to torch's default
        timeout = dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError):
        return None
    return timeout if isinstance(timeout, timedelta) else None
