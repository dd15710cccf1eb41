"""Helpers of scripts run under ``torch.distributed.run``: am I a worker, a free port, how a worker ends (the
launching itself: :mod:`megatron_bridge.launcher.local`)."""

import contextlib
import os
import socket
from collections.abc import Iterator


def running_under_torchrun() -> bool:
    """True inside a process started by torch.distributed.run."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_WORLD_SIZE" in os.environ


@contextlib.contextmanager
def reserved_ports(count: int = 1) -> Iterator[list[int]]:
    """``count`` distinct free TCP ports, held for the ``with`` block by sockets bound to them (not listening).

    A port merely found free and released can be taken before the launched job binds it: another process's ``bind``
    to port 0 (every gloo pair's listener) or the kernel choosing it for an outgoing connection (a CI run failed so,
    "the port is in use"). While a socket is bound to it, the kernel gives the port to neither, yet a server that
    sets ``SO_REUSEADDR`` before binding, as torch's TCPStore and Slurm's daemons do, binds and listens on it: hold
    the block until the job has ended.
    """
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", 0))
        yield [int(s.getsockname()[1]) for s in sockets]


@contextlib.contextmanager
def reserved_port() -> Iterator[int]:
    """One port of :func:`reserved_ports`: ``with reserved_port() as port: run(... --master_port=port ...)``."""
    with reserved_ports(1) as (port,):
        yield port


def finish_worker(code: int = 0) -> int:
    """End a torchrun worker with ``os._exit`` after flushing (torch 2.13's gloo can abort a rank during interpreter
    teardown, after all work is done); outside torchrun, just return ``code``."""
    from megatron_bridge.utils.cli import finish

    return finish(code)


def end_worker(code: int = 0) -> int:
    """End a torchrun worker that owns its process group (the benchmark scripts): barrier and destroy the group if
    one is up, then :func:`finish_worker` (flush, ``os._exit``)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return finish_worker(code)
