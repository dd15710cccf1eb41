"""Helpers of scripts run under ``torch.distributed.run``: am I a worker, a free port, how a worker ends (the
launching itself: :mod:`megatron_bridge.launcher.local`)."""

import os
import socket


def running_under_torchrun() -> bool:
    """True inside a process started by torch.distributed.run."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_WORLD_SIZE" in os.environ


def free_port() -> int:
    """A free TCP port on localhost."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
