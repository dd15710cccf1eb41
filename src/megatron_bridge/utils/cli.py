"""How every script ends: one clean line for errors a user can fix, a traceback only for crashes or when asked.

``sys.exit(run_cli(main))`` at the bottom of a script gives it these exit codes:

=====  ==========================================================================================================
0      success
1      a crash: an unexpected exception (its traceback is printed)
2      a user error: a project error (:class:`~megatron_bridge.errors.MegatronBridgeError`, e.g. a bad config value
       or a corrupt file, or :class:`~megatron_bridge.errors.TrainingError`, e.g. a NaN loss) printed as one
       ``error: ...`` line; argparse's usage errors also exit with 2
3      this rank stopped because another rank failed (the first error is in that rank's output)
4      (a training script's own choice) stopped by the exit signal after saving a checkpoint: not finished, start it
       again to resume. The scripts of this project exit 0 after such a stop (a non-zero code would make ``srun
       --kill-on-bad-exit`` stop the other nodes while they still write); a batch script tells a stop from the end by
       the checkpoint step (docs/training/multi-node.md, "Preemption")
130    interrupted (Ctrl-C)
=====  ==========================================================================================================

``--debug`` on the command line (removed before ``main`` parses its arguments) or ``MEGATRON_BRIDGE_DEBUG=1`` prints
the full traceback of project errors too; ``--debug`` sets the variable, so torchrun workers inherit it. Under
torchrun every worker ends with ``os._exit`` after flushing (torch 2.13's gloo can abort during interpreter teardown;
a failed job may also leave threads blocked on an aborted process group).
"""

import argparse
import inspect
import os
import re
import sys
import traceback
from collections.abc import Callable

from megatron_bridge.errors import MegatronBridgeError, TrainingError


EXIT_OK = 0
EXIT_CRASH = 1
EXIT_USER_ERROR = 2
EXIT_PEER_FAILURE = 3
EXIT_PREEMPTED = 4
EXIT_INTERRUPTED = 130
DEBUG_ENV = "MEGATRON_BRIDGE_DEBUG"
DEBUG_FLAG = "--debug"


def say(message: str) -> None:
    """Write one message line to stderr (the CLI's user-facing output; the library itself only logs)."""
    sys.stderr.write(f"{message}\n")
    sys.stderr.flush()


def debug_enabled() -> bool:
    """True when ``MEGATRON_BRIDGE_DEBUG`` is set to something other than "", "0" or "false"."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _where(exc: BaseException) -> str:
    from megatron_bridge.utils.dist_env import node_index

    rank, node = getattr(exc, "rank", None), node_index()
    if rank is None:
        return ""
    return f" (rank {rank})" if node is None else f" (rank {rank}, node {node})"


def describe(exc: BaseException) -> tuple[str, int]:
    """The one-line message (no traceback) and exit code for an exception that ended a script."""
    if isinstance(exc, MegatronBridgeError | TrainingError):
        return f"error{_where(exc)}: {exc}", EXIT_USER_ERROR
    if getattr(exc, "peer_failure", False):
        first = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).strip().split("\n")[0]).split(". ")[0][:160]
        return (f"stopped{_where(exc)}: another rank failed, so a collective could not complete ({first}); the "
                "first error is in that rank's output", EXIT_PEER_FAILURE)
    if isinstance(exc, KeyboardInterrupt):
        return f"interrupted{_where(exc)}", EXIT_INTERRUPTED
    return f"crashed{_where(exc)}: {type(exc).__name__}: {exc}", EXIT_CRASH


def run_cli(main: Callable[[list[str]], int | None], argv: list[str] | None = None) -> int:
    """Call ``main(argv)`` and turn what it raises into one message and an exit code (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if DEBUG_FLAG in argv:
        argv = [a for a in argv if a != DEBUG_FLAG]
        os.environ[DEBUG_ENV] = "1"
    try:
        code = (main(argv) if inspect.signature(main).parameters else main()) or EXIT_OK
    except SystemExit as exc:  # argparse usage errors and explicit sys.exit calls keep their codes
        code = exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_CRASH)
        if not isinstance(exc.code, int | None):
            say(str(exc.code))
    except BaseException as exc:  # noqa: BLE001  (this is the last handler of the process)
        message, code = describe(exc)
        if code == EXIT_CRASH or debug_enabled():
            traceback.print_exc()
        if code != EXIT_CRASH:
            say(message)
    return finish(code)


def finish(code: int) -> int:
    """Return ``code``; under torchrun flush and end the worker with ``os._exit(code)`` instead."""
    if "TORCHELASTIC_RUN_ID" not in os.environ and "LOCAL_WORLD_SIZE" not in os.environ:
        return code
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def positive_int(value: str) -> int:
    """An integer >= 1 (process counts, parallel sizes, batch sizes, steps)."""
    return _int_at_least(value, 1)


def non_negative_int(value: str) -> int:
    """An integer >= 0 (``--max_restarts``, ``--node_rank``)."""
    return _int_at_least(value, 0)


def _int_at_least(value: str, minimum: int) -> int:
    try:
        number = int(value, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {number}")
    return number


_TRUE = {"true", "1", "yes", "y", "t", "on"}
_FALSE = {"false", "0", "no", "n", "f", "off"}


def bool_arg(value: str | bool) -> bool:
    """Parse true/false/1/0/yes/no/t/f (any case), as Megatron-Bridge's ``bool_arg``."""
    if isinstance(value, bool):
        return value
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false/1/0/yes/no), got {value!r}")
