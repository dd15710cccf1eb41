"""Re-launching a script under torch's launcher (through :mod:`megatron_bridge.launcher.torchrun`) when more than one
process, several nodes or a restart budget is asked for."""

import os
import sys

from megatron_bridge.launcher.nodes import NodeLayout, torchrun_arguments
from megatron_bridge.utils.launch import reserved_port


def relaunch_with_torchrun(nproc: int, argv: list[str] | None = None, threads_per_rank: int | None = None,
                           layout: NodeLayout | None = None) -> int:
    """Run this script again on ``nproc`` local ranks (per node: ``layout`` gives the nodes, the rendezvous and the
    restart budget; default one node, a free local port, no restart); returns torchrun's exit code.

    Each one-node launch without ``--master_port`` uses a free port of its own, reserved for the job's length (two
    jobs on one machine do not collide: :func:`megatron_bridge.utils.launch.reserved_ports`). On machines without CUDA,
    ``OMP_NUM_THREADS`` defaults to cores // nproc (at least 1) so ranks do not oversubscribe the CPU.

    No orphans: torchrun (through :mod:`megatron_bridge.launcher.torchrun`, which returns the workers' exit code) runs
    in its own process group and gets SIGTERM from the kernel if this process dies; SIGINT/SIGTERM/SIGHUP sent to
    this process are forwarded to it (:func:`megatron_bridge.utils.process.run_job`), and it stops the workers.
    """
    from megatron_bridge.utils.process import run_job

    args = argv if argv is not None else sys.argv
    with reserved_port() as port:  # held until the job ends: nothing else on this machine takes it meanwhile
        node_flags = torchrun_arguments(layout or NodeLayout(), nproc, free_port=port)
        cmd = [sys.executable, "-m", "megatron_bridge.launcher.torchrun", *node_flags, *args]
        return run_job(cmd, env=worker_env(nproc, threads_per_rank))


def worker_env(nproc: int, threads_per_rank: int | None = None) -> dict[str, str]:
    """This process's environment for the launch, with ``PYTHONUNBUFFERED=1`` and ``OMP_NUM_THREADS`` unless already
    set: ``threads_per_rank``, or on machines without CUDA cores // ``nproc`` (at least 1). torch is imported (for
    the CUDA check) only when that default is needed, so a launch with ``OMP_NUM_THREADS`` set starts ~2 s sooner."""
    env = dict(os.environ)
    if "OMP_NUM_THREADS" not in env:
        if threads_per_rank is None:
            import torch

            if not torch.cuda.is_available():
                threads_per_rank = max(1, (os.cpu_count() or 1) // nproc)
        if threads_per_rank is not None:
            env["OMP_NUM_THREADS"] = str(threads_per_rank)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
