"""Rank-aware logging helpers. The library never uses bare ``print``."""

import logging

from megatron_bridge.utils.dist_env import get_rank, is_last_rank, node_index


_WARNED_ONCE: set[str] = set()


def get_logger(name: str) -> logging.Logger:
    """The library's logger for a module (``logging.getLogger`` under the ``megatron_bridge`` namespace)."""
    return logging.getLogger(name)


def log_rank_0(logger: logging.Logger, msg: str, *args: object, level: int = logging.INFO) -> None:
    """Log on global rank 0 only."""
    if get_rank() == 0:
        logger.log(level, msg, *args)


def log_last_rank(logger: logging.Logger, msg: str, *args: object, level: int = logging.INFO) -> None:
    """Log on the last rank only (where the training log is printed)."""
    if is_last_rank():
        logger.log(level, msg, *args)


def warn_once(logger: logging.Logger, key: str, msg: str, *args: object) -> None:
    """Log a warning once per process for ``key`` (on every rank that reaches it)."""
    if key in _WARNED_ONCE:
        return
    _WARNED_ONCE.add(key)
    logger.warning(msg, *args)


def setup_logging(level: int | str = logging.INFO) -> None:
    """Configure the root ``megatron_bridge`` logger once: one line per record, with the rank (and the node, in a job
    over several nodes)."""
    root = logging.getLogger("megatron_bridge")
    if any(getattr(h, "_megatron_bridge", False) for h in root.handlers):
        root.setLevel(level)
        return
    handler = logging.StreamHandler()
    handler._megatron_bridge = True  # type: ignore[attr-defined]
    node = node_index()  # jobs over several nodes: "rank5 node2"
    where = f"rank{get_rank()}" + (f" node{node}" if node is not None else "")
    handler.setFormatter(logging.Formatter(f"[%(asctime)s {where}] %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
