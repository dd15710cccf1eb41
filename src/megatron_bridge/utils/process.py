"""No orphans: workers exit when their launcher dies, launchers forward SIGINT/SIGTERM to the job they started.

* :func:`watch_parent` (called by ``pretrain`` under torchrun): a daemon thread polls the parent pid; when the
  launcher is gone (killed, even with SIGKILL) the worker sends itself SIGTERM (a graceful stop when
  ``train.exit_signal_handler`` handles SIGTERM, else the default: exit) and, should it still run after a grace
  period, ends with ``os._exit``.
* :func:`set_parent_death_signal`: Linux ``prctl(PR_SET_PDEATHSIG)`` through ctypes (the kernel signals the child
  the moment its parent dies); used for the torchrun process a launcher starts.
* :func:`run_job`: start a command in its own process group (so a terminal's Ctrl-C reaches only the launcher),
  forward SIGINT, SIGTERM and SIGHUP to that group, and return its exit code.
"""

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)

PR_SET_PDEATHSIG = 1
"""``prctl`` option number (linux/prctl.h)."""
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Signals a launcher passes on to the job it started."""

_WATCHER: threading.Thread | None = None


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only); True when set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int, poll_s: float, grace_s: float, on_orphan: Callable[[], None] | None) -> None:
    while os.getppid() == parent:
        time.sleep(poll_s)
    logger.error("the launcher (pid %d) is gone: stopping this worker (pid %d)", parent, os.getpid())
    if on_orphan is not None:
        on_orphan()
        return
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    logger.error("still running %.0f s after SIGTERM: exiting", grace_s)
    os._exit(1)


def watch_parent(poll_s: float = 0.5, grace_s: float = 5.0, on_orphan: Callable[[], None] | None = None) -> bool:
    """Start (once per process) the thread that stops this worker when its parent process dies.

    Only under a launcher (torchrun sets ``TORCHELASTIC_RUN_ID``/``LOCAL_WORLD_SIZE``) that is not pid 1; returns
    True when watching.
    ``on_orphan`` replaces the default reaction (SIGTERM to self, ``os._exit(1)`` after ``grace_s``), for tests.
    """
    global _WATCHER
    if _WATCHER is not None and _WATCHER.is_alive():
        return True
    if "TORCHELASTIC_RUN_ID" not in os.environ and "LOCAL_WORLD_SIZE" not in os.environ:
        return False
    parent = os.getppid()
    if parent == 1:  # the launcher is init (e.g. torchrun as a container's pid 1): it cannot die before us
        return False
    _WATCHER = threading.Thread(target=_watch, args=(parent, poll_s, grace_s, on_orphan), daemon=True,
                                name="parent-watch")
    _WATCHER.start()
    return True


def _in_new_group_with_death_signal() -> None:  # runs in the child between fork and exec
    os.setsid()
    set_parent_death_signal(signal.SIGTERM)


def run_job(cmd: Sequence[str], env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` in its own session and process group; forward SIGINT/SIGTERM/SIGHUP to it; return its exit code.

    The child also gets SIGTERM from the kernel if this process dies without forwarding (e.g. SIGKILL). A second
    signal of the same kind while waiting is forwarded again; the child decides how to stop (torchrun stops its
    workers with SIGTERM, then SIGKILL after 30 s).
    """
    proc = subprocess.Popen(list(cmd), env=env, preexec_fn=_in_new_group_with_death_signal)  # noqa: PLW1509

    def forward(signum: int, frame: object) -> None:
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:  # an exception (not a signal) ended the wait: do not leave the job behind
            forward(signal.SIGTERM, None)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                forward(signal.SIGKILL, None)
