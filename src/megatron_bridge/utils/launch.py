"""Re-launching a script under ``torch.distributed.run`` when more than one process is asked for."""

import os
import socket
import sys


def running_under_torchrun() -> bool:
    """True inside a process started by torch.distributed.run."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_WORLD_SIZE" in os.environ


def free_port() -> int:
    """A free TCP port on localhost."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def relaunch_with_torchrun(nproc: int, argv: list[str] | None = None, threads_per_rank: int | None = None) -> int:
    """Run this script again on ``nproc`` local ranks; returns torchrun's exit code.

    Each launch uses its own free port (two jobs on one machine do not collide). On machines without CUDA,
    ``OMP_NUM_THREADS`` defaults to cores // nproc (at least 1) so ranks do not oversubscribe the CPU.

    No orphans: torchrun (through :mod:`megatron_bridge.utils.torchrun`, which returns the workers' exit code) runs
    in its own process group and gets SIGTERM from the kernel if this process dies; SIGINT/SIGTERM/SIGHUP sent to
    this process are forwarded to it (:func:`megatron_bridge.utils.process.run_job`), and it stops the workers.
    """
    import torch

    from megatron_bridge.utils.process import run_job

    args = argv if argv is not None else sys.argv
    env = dict(os.environ)
    if threads_per_rank is None and not torch.cuda.is_available():
        threads_per_rank = max(1, (os.cpu_count() or 1) // nproc)
    if threads_per_rank is not None:
        env.setdefault("OMP_NUM_THREADS", str(threads_per_rank))
    env.setdefault("PYTHONUNBUFFERED", "1")
    cmd = [sys.executable, "-m", "megatron_bridge.utils.torchrun", f"--nproc_per_node={nproc}",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", *args]
    return run_job(cmd, env=env)


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
