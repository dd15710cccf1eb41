"""Stop signals a worker remembers from the moment it catches them: a scheduler's preemption or pre-time-limit signal
(Slurm's ``--signal``, ``scancel --signal``) that asks the run to save a checkpoint and stop.

:func:`catch` installs one handler for the given signals that only records the first one received; the training loop
(:class:`megatron_bridge.training.exits.ExitConditions`) agrees on it over all ranks at the next step boundary, or
before the first step when it came during start-up (model build, checkpoint load, data loading). A signal is never
lost between being caught here and the loop looking at it.

``train.exit_signal_handler`` catches ``train.exit_signal``; a Slurm job's workers (``scripts/performance/launch.py``
with ``-a/-p``) catch all of :data:`SCHEDULER_STOP_SIGNALS` as soon as they start, whatever ``train.exit_signal``
says (docs/training/multi-node.md, "Slurm").
"""

import atexit
import signal
from collections.abc import Iterable
from types import FrameType

from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)

SCHEDULER_STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT")
"""What a scheduler or a user sends to stop a job early (Slurm's ``--signal``, ``scancel --signal``)."""

_received: int | None = None
_previous: dict[int, object] = {}
_exit_hook = False


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _received
    if _received is None:
        _received = signum
        logger.warning("received %s: saving a checkpoint and stopping at the next step boundary",
                       signal.Signals(signum).name)


def catch(names: Iterable[str]) -> list[str]:
    """Remember the first of these signals (names such as ``SIGUSR1``) from now on; returns the names newly caught
    (one already caught stays so). Main thread only (Python's rule for signal handlers)."""
    global _exit_hook
    if not _exit_hook:  # a repeat of the signal while the process exits must not kill it (Python's finalization
        atexit.register(_ignore_while_exiting)  # puts the default action back before the process is gone)
        _exit_hook = True
    added = []
    for name in names:
        signum = int(getattr(signal, name))
        if signum not in _previous:
            _previous[signum] = signal.signal(signum, _on_signal)
            added.append(name)
    # a Slurm job's launcher starts its workers with these blocked (launcher/restart.py hold_at_spawn): one that came
    # during start-up is pending and arrives now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [int(getattr(signal, name)) for name in names])
    return added


def _ignore_while_exiting() -> None:
    for signum in list(_previous):
        signal.signal(signum, signal.SIG_IGN)


def release(names: Iterable[str]) -> None:
    """Give these signals their handlers from before :func:`catch` back (what is received stays remembered)."""
    for name in names:
        signum = int(getattr(signal, name))
        if signum in _previous:
            signal.signal(signum, _previous.pop(signum))  # type: ignore[arg-type]


def received() -> int | None:
    """The first stop signal caught (its number), or None."""
    return _received


def received_name() -> str | None:
    """``SIGUSR1`` for :func:`received`, or None."""
    return signal.Signals(_received).name if _received is not None else None


def forget() -> None:
    """Clear the remembered signal (a new run in the same process, tests)."""
    global _received
    _received = None
