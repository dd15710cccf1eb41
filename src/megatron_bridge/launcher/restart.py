"""Which failures torch's elastic agent restarts, and what the job says about each.

torch's agent (``torch.distributed.run --max_restarts K``) restarts every worker of the job after any worker failure.
Some failures come back identically on every attempt: a bad config value, a corrupt file, a NaN loss — every
project error, exit code 2 (:mod:`megatron_bridge.utils.cli`). Retrying those only repeats the message K times, so:

* the worker that raises such an error writes ``NO_RESTART_KEY`` into the job's rendezvous store *before* it aborts
  its process groups (:func:`megatron_bridge.training.job.forbid_restart_after`, called by ``pretrain()``), so every
  node's agent finds it by the time its own workers fail because of it;
* :class:`RestartPolicyAgent` (torch's ``LocalElasticAgent`` with this policy; ``megatron_bridge.launcher.torchrun``
  runs it) gives up instead of restarting when a worker of its node exited with code 2, a worker exited with
  :data:`~megatron_bridge.utils.cli.EXIT_PREEMPTED` (stopped by the exit signal after saving), the key is in the
  store, or the launcher itself got a stop signal (:func:`note_stop_signal`).

Every failure is reported as one line naming the rank, its node and the signal or exit code
(:func:`describe_failure`): a worker's own error before a rank that only stopped because of it (exit code 3), which
the agent gives :data:`PEER_GRACE_S` to be seen exiting (:func:`await_first_error`); a restart says so too.
"""

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from megatron_bridge.launcher.nodes import DEFAULT_RDZV_TIMEOUT_S
from megatron_bridge.training.job import NO_RESTART_KEY, rendezvous_store
from megatron_bridge.utils.cli import EXIT_PEER_FAILURE, EXIT_PREEMPTED, EXIT_USER_ERROR, say
from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)

PEER_GRACE_S = 3.0
"""Seconds the agent waits, once a worker of its node exited because another rank failed (exit code 3), for its other
workers to end on their own before torch's agent stops them with SIGTERM. The rank whose error it was is then usually
still exiting (it aborts its process groups first, which is what stopped the others), and its own exit code (2 for a
user error) is the one to report and to decide a restart by. A hung rank costs the job these seconds more."""

_AGENT: "Any | None" = None
_STOP_SIGNAL: int | None = None
_HELD_AT_SPAWN: tuple[int, ...] = ()
_REQUESTED_NNODES: int | None = None


def signal_name(number: int) -> str:
    """SIGKILL for 9 (the number itself when unknown)."""
    return signal.Signals(number).name if number in signal.valid_signals() else str(number)


def describe_failure(rank: int, exitcode: int, nproc_per_node: int) -> str:
    """"rank 3 (node 1, host h) was killed by SIGKILL" / "... exited with code 1"; the node is
    ``rank // nproc_per_node`` (torch gives each node a contiguous block of ranks)."""
    where = f"rank {rank} (node {rank // max(1, nproc_per_node)}, host {socket.gethostname()})"
    if exitcode < 0:
        return f"{where} was killed by {signal_name(-exitcode)}"
    return f"{where} exited with code {exitcode}"


def failure_order(exitcode: int) -> int:
    """Which failure explains a job's end best (lowest first): a worker's own error (code 1, 2, ...), then a death
    by a signal other than SIGTERM (kill -9, the OOM killer, a segfault), then a rank that only stopped because
    another failed (code 3), then a death by SIGTERM (what torch's agent sends the workers still running once one
    failed)."""
    if exitcode > 0 and exitcode != EXIT_PEER_FAILURE:
        return 0
    if exitcode < 0:
        return 3 if -exitcode == signal.SIGTERM else 1
    return 2


def first_failure(failures: dict[int, Any]) -> tuple[int, int]:
    """(rank, exit code) of the failure to report among torch's ``{rank: ProcessFailure}``."""
    rank, failure = min(failures.items(), key=lambda item: (failure_order(item[1].exitcode), item[1].timestamp))
    return rank, failure.exitcode


def await_first_error(procs: dict[int, Any], grace_s: float = PEER_GRACE_S) -> None:
    """If a worker process (``subprocess.Popen``-like: ``poll()``) exited with code 3 while others still run, wait up
    to ``grace_s`` seconds until they all ended or one ended with another code; return at once otherwise."""
    deadline = time.monotonic() + grace_s
    while True:
        codes = [proc.poll() for proc in procs.values()]
        own_error = any(code not in (None, 0, EXIT_PEER_FAILURE) for code in codes)
        if EXIT_PEER_FAILURE not in codes or None not in codes or own_error or time.monotonic() >= deadline:
            return
        time.sleep(0.02)


def note_stop_signal(signum: int) -> None:
    """The launcher got a stop signal (preemption): no restart from now on; forward it to this node's workers."""
    global _STOP_SIGNAL
    _STOP_SIGNAL = signum
    agent = _AGENT
    if agent is not None:
        agent.forward_signal(signum)


def catches(pid: int, signum: int) -> bool:
    """True when process ``pid`` has a handler for ``signum`` (Linux: the ``SigCgt`` mask of /proc/PID/status)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def _send(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def hold_at_spawn(signums: tuple[int, ...]) -> None:
    """Start every worker with these signals blocked: one that arrives while the worker starts up stays pending until
    the worker handles it (:func:`megatron_bridge.training.stop_signals.catch` unblocks them), instead of killing it
    or being lost. For workers that catch them at start-up (a Slurm job's), not for any script."""
    global _HELD_AT_SPAWN
    _HELD_AT_SPAWN = tuple(signums)


def request_nnodes(nnodes: str) -> None:
    """The ``--nnodes`` this node was started with: the node count the agreement compares. The rendezvous' own count
    is the same under ``--master_addr``, but torch's c10d rendezvous completes with as many nodes as the node that
    asks for the fewest (its ``min_nodes``), so a node started with more would train in a smaller job. An elastic
    range (``MIN:MAX``) compares the rendezvous' count."""
    global _REQUESTED_NNODES
    _REQUESTED_NNODES = int(nnodes) if str(nnodes).isdigit() else None


def stop_signal() -> int | None:
    """The stop signal the launcher got (None without one)."""
    return _STOP_SIGNAL


def _settings_watcher(spec: Any) -> Any:
    """A started watcher of the other nodes' settings while the rendezvous waits
    (:mod:`megatron_bridge.launcher.node_agreement`): node 0 of a static rendezvous over several nodes (its store
    waits for nodes before the agreement can run) and every node of a c10d rendezvous started with a fixed
    ``--nnodes`` above 1 (it may never complete); None for every other node and rendezvous, and for one-node jobs."""
    from megatron_bridge.launcher import node_agreement

    handler = spec.rdzv_handler
    if handler.get_backend() == "static":
        if getattr(handler, "rank", None) != 0 or handler.world_size <= 1:
            return None
        mine = node_agreement.NodeSettings(handler.world_size, spec.local_world_size, spec.max_restarts)
        return node_agreement.SettingsWatcher(handler.master_addr, handler.master_port, handler.get_run_id(), mine,
                                              handler.timeout.total_seconds()).start()
    store = getattr(handler, "_store", None)  # the c10d backend's TCPStore (host and port of the rendezvous)
    if handler.get_backend() != "c10d" or not _REQUESTED_NNODES or _REQUESTED_NNODES <= 1 or \
            not hasattr(store, "host"):
        return None
    mine = node_agreement.NodeSettings(_REQUESTED_NNODES, spec.local_world_size, spec.max_restarts)
    try:
        return node_agreement.ArrivalWatcher(store.host, store.port, handler.get_run_id(), mine,
                                             DEFAULT_RDZV_TIMEOUT_S).start()
    except Exception:  # noqa: BLE001  (store unreachable: the rendezvous itself reports it)
        return None


def restart_policy_agent() -> type:
    """torch's ``LocalElasticAgent`` with this module's restart policy and failure lines (a class made on first use:
    importing this module does not import torch)."""
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    class RestartPolicyAgent(LocalElasticAgent):
        """Restarts only failures that may go away; names every failure and restart."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            global _AGENT
            super().__init__(*args, **kwargs)
            _AGENT = self

        def forward_signal(self, signum: int) -> None:
            """Send ``signum`` to every worker of this node that still runs."""
            for pid in self._worker_pids():
                _send(pid, signum)
                self._forwarded = {*getattr(self, "_forwarded", set()), pid}

        def forward_to_late_workers(self, signum: int) -> None:
            """Workers started after the stop signal (it came during the rendezvous or a restart): send it to each
            once it handles it (it would kill one still starting up); a worker never told would train on."""
            for pid in self._worker_pids():
                if pid not in getattr(self, "_forwarded", set()) and catches(pid, signum):
                    _send(pid, signum)
                    self._forwarded = {*getattr(self, "_forwarded", set()), pid}

        def _rendezvous(self, worker_group: WorkerGroup) -> None:
            watcher = _settings_watcher(worker_group.spec) if not getattr(self, "_agreed", False) else None
            try:
                super()._rendezvous(worker_group)
            except Exception as exc:
                if watcher is not None and watcher.problem is not None:  # node 0's wait ended: name the difference
                    from megatron_bridge.errors import LaunchError

                    raise LaunchError(watcher.problem) from exc
                raise
            finally:
                if watcher is not None:
                    watcher.stop()

        def _assign_worker_ranks(self, store: Any, group_rank: int, group_world_size: int, spec: Any) -> Any:
            from megatron_bridge.launcher.node_agreement import NodeSettings, agree

            if not getattr(self, "_agreed", False):  # once: a restart's rendezvous meets the same launchers
                timeout = getattr(spec.rdzv_handler, "timeout", None)
                timeout_s = timeout.total_seconds() if hasattr(timeout, "total_seconds") else DEFAULT_RDZV_TIMEOUT_S
                nnodes = _REQUESTED_NNODES or group_world_size
                agree(store, group_rank, NodeSettings(nnodes, spec.local_world_size, spec.max_restarts), timeout_s)
                self._agreed = True
            return super()._assign_worker_ranks(store, group_rank, group_world_size, spec)

        def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
            if not _HELD_AT_SPAWN:
                return super()._start_workers(worker_group)
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_AT_SPAWN)  # the workers inherit the mask
            try:
                return super()._start_workers(worker_group)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)

        def _worker_pids(self) -> list[int]:
            pcontext = getattr(self, "_pcontext", None)
            return list(pcontext.pids().values()) if pcontext is not None else []

        def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
            if _STOP_SIGNAL is not None:
                self.forward_to_late_workers(_STOP_SIGNAL)
            handlers = getattr(getattr(self, "_pcontext", None), "subprocess_handlers", None) or {}
            await_first_error({rank: handler.proc for rank, handler in handlers.items()})
            result = super()._monitor_workers(worker_group)
            if result.state == WorkerState.FAILED and result.failures:
                self._report(worker_group, result)
            return result

        def _report(self, worker_group: WorkerGroup, result: RunResult) -> None:
            spec = worker_group.spec
            rank, code = first_failure(result.failures)
            reason = self._no_restart_reason(worker_group, result)
            if reason is not None:
                self._remaining_restarts = 0
            if self._remaining_restarts <= 0:
                if reason is not None and spec.max_restarts > 0:
                    say(f"not restarting: {reason}")
                return
            attempt = spec.max_restarts - self._remaining_restarts + 1
            say(f"{describe_failure(rank, code, spec.local_world_size)}: restarting every worker (restart "
                f"{attempt} of {spec.max_restarts}); they resume from the last complete checkpoint")

        def _no_restart_reason(self, worker_group: WorkerGroup, result: RunResult) -> str | None:
            codes = {failure.exitcode for failure in result.failures.values()}
            if _STOP_SIGNAL is not None:
                return f"the launcher got {signal_name(_STOP_SIGNAL)} (preemption or a time limit)"
            if EXIT_PREEMPTED in codes:
                return "the workers stopped on the exit signal (train.exit_signal) after saving a checkpoint"
            if EXIT_USER_ERROR in codes:
                return "a worker stopped with an error that a restart repeats (exit code 2: its message is above)"
            if self._remaining_restarts > 0:  # only then is the store worth a round trip (its host may be gone)
                return self._read_store(worker_group)
            return None

        def _read_store(self, worker_group: WorkerGroup) -> str | None:
            try:
                store = rendezvous_store(worker_group.master_addr, worker_group.master_port)
                if store.check([NO_RESTART_KEY]):
                    reason = store.get(NO_RESTART_KEY).decode(errors="replace")
                    return f"another rank reported an error that a restart repeats ({reason})"
            except Exception as exc:  # noqa: BLE001
                logger.debug("could not read %s: %s", NO_RESTART_KEY, exc)
            return None

    return RestartPolicyAgent
