"""``python -m megatron_bridge.utils.torchrun ARGS``: torchrun (``torch.distributed.run``, same arguments) that ends
with the workers' own exit code and one line instead of torchrun's ``ChildFailedError`` traceback.

The launchers of this project (:func:`megatron_bridge.utils.launch.relaunch_with_torchrun`) start it in its own
process group with a parent-death signal, so it also stops its workers when the launcher is killed. torchrun's
behaviour, unchanged here: on SIGINT/SIGTERM/SIGHUP it sends SIGTERM to every worker (each in its own session) and
SIGKILL to those still alive 30 s later; when one worker exits with an error it stops the others the same way.

Exit code: the first failed worker's (a project error is 2, see :mod:`megatron_bridge.utils.cli`); a worker that
only stopped because another one failed (code 3) is never reported as the first failure when another one is known.
"""

import logging
import signal
import sys

from megatron_bridge.utils.cli import DEBUG_FLAG, EXIT_CRASH, EXIT_PEER_FAILURE, EXIT_USER_ERROR, debug_enabled, say
from megatron_bridge.utils.process import set_parent_death_signal


def _first_failure(failures: dict) -> tuple[int, int]:
    """(rank, exit code) of the failure to report: the earliest worker error, else the earliest peer-failure
    consequence (code 3), else the earliest death by a signal (usually torchrun's own SIGTERM)."""

    def order(item: tuple) -> tuple[int, float]:
        code = item[1].exitcode
        return (0 if code > 0 and code != EXIT_PEER_FAILURE else 1 if code == EXIT_PEER_FAILURE else 2,
                item[1].timestamp)

    rank, failure = min(failures.items(), key=order)
    return rank, failure.exitcode


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv``; returns the exit code described in the module docstring."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    set_parent_death_signal(signal.SIGTERM)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not debug_enabled() and DEBUG_FLAG not in argv:
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        run(parse_args(argv))
    except ChildFailedError as exc:
        rank, code = _first_failure(exc.failures)
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            say(f"error: rank {rank} was killed by {name}")
            return 128 - code
        if code not in (EXIT_USER_ERROR, EXIT_PEER_FAILURE):
            say(f"error: rank {rank} exited with code {code}; its output is above")
        return code if code > 0 else EXIT_CRASH
    except SignalException as exc:
        say(f"stopped by {signal.Signals(exc.sigval).name}: the workers were terminated")
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
