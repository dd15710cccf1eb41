"""``python -m megatron_bridge.launcher.torchrun ARGS``: torchrun (``torch.distributed.run``, same arguments) that ends
with the workers' own exit code and one line instead of torchrun's ``ChildFailedError`` traceback.

The launchers of this project (:func:`megatron_bridge.launcher.local.relaunch_with_torchrun`) start it in its own
process group with a parent-death signal, so it also stops its workers when the launcher is killed. torchrun's
behaviour, kept here: on SIGINT/SIGHUP it sends SIGTERM to every worker (each in its own session) and SIGKILL to
those still alive 30 s later; when one worker exits with an error it stops the others the same way.

Differences from plain torchrun:

* **Stop signals** (SIGTERM, SIGUSR1, SIGUSR2: a scheduler's preemption or pre-time-limit signal) do not kill this
  launcher (plain torchrun dies on SIGUSR1 and kills its workers at once on SIGTERM). The first one is forwarded to
  this node's workers, which save a checkpoint at one agreed step and exit when ``train.exit_signal_handler`` handles
  that signal (``train.exit_signal``); no restart follows; later stop signals are ignored (a scheduler repeats them,
  e.g. Slurm's step termination when another node's task ended: the workers may still be writing). SIGINT stops the
  workers at once. A stop signal this launcher was started with ignored (Slurm's script: ``trap "" SIGNAL``, since
  Slurm signals every process of the job itself) stays ignored, here and in the workers, which handle it only when
  ``train.exit_signal_handler`` installs a handler for it.
* **Restarts** (``--max_restarts K``): torch's elastic agent with the policy of
  :mod:`megatron_bridge.launcher.restart`: errors that a restart repeats (exit code 2) are not retried, every
  failure and restart is named (rank, node, signal or exit code).
* **Rendezvous failures** (nobody answers at the endpoint within the rendezvous timeout): one ``error:`` line, code 2.

Exit code: 0 when every worker ended cleanly (also after a stop signal: a batch script tells a preempted run from a
finished one by the checkpoint step, ``latest_checkpointed_iteration.txt`` below ``train_iters``, see
docs/training/multi-node.md); :data:`~megatron_bridge.utils.cli.EXIT_PREEMPTED` (4) when a training script chose to
exit with it; otherwise the failure that explains the end best
(:func:`megatron_bridge.launcher.restart.first_failure`: a worker's own error, else a death by a signal — 128 +
signal —, else code 3, a rank that stopped because another failed).
"""

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from megatron_bridge.errors import LaunchError
from megatron_bridge.launcher.restart import (
    describe_failure,
    first_failure,
    hold_at_spawn,
    note_stop_signal,
    request_nnodes,
    restart_policy_agent,
    signal_name,
    stop_signal,
)
from megatron_bridge.utils.cli import (
    DEBUG_FLAG,
    EXIT_CRASH,
    EXIT_PEER_FAILURE,
    EXIT_PREEMPTED,
    EXIT_USER_ERROR,
    debug_enabled,
    say,
)
from megatron_bridge.utils.process import set_parent_death_signal


STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
"""Signals that ask the job to save and stop (forwarded to the workers; this launcher survives them)."""
TORCH_HANDLED_SIGNALS = "SIGINT,SIGHUP,SIGQUIT"
"""torchrun's ``--signals_to_handle`` without the stop signals: what torch's agent still turns into an immediate
stop of the workers (the stop signals are removed from whatever list is given)."""


OWN_FLAGS = ("--stop_signals", "--stop_file", "--heartbeat_file")
"""This wrapper's own flags (``--flag=VALUE`` before the script), taken out before torch's parser sees the rest."""
_OWN: dict[str, str] = {}


def _on_stop_signal(signum: int, frame: FrameType | None) -> None:
    if stop_signal() is not None:  # a scheduler's repeat, or its step termination: the workers are already stopping
        return
    at_once = "" if "--stop_signals" in _OWN else " (SIGINT stops them at once)"
    say(f"got {signal_name(signum)}: the workers save a checkpoint at the next step boundary and stop{at_once}")
    if "--stop_file" in _OWN:  # the batch script reads it: a stop, not a failure (even before the first step)
        try:
            with open(_OWN["--stop_file"], "a") as f:
                f.write(f"{signal_name(signum)} node {_OWN.get('node_rank', '?')}\n")
        except OSError as exc:
            say(f"could not record {signal_name(signum)} in {_OWN['--stop_file']}: {exc}")
    note_stop_signal(signum)


def take_own_flags(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """``argv`` without :data:`OWN_FLAGS` (``--stop_signals=SIGTERM,SIGUSR1`` and ``--stop_file=PATH``, before the
    script), and their values."""
    rest, own, in_script = [], {}, False
    for arg in argv:
        name, sep, value = arg.partition("=")
        if not in_script and sep and name in OWN_FLAGS:
            own[name] = value
            continue
        in_script = in_script or not arg.startswith("-")
        rest.append(arg)
    return rest, own


def stop_signals_of(own: dict[str, str]) -> tuple[signal.Signals, ...]:
    """The stop signals: ``--stop_signals`` (names, with or without ``SIG``), else :data:`STOP_SIGNALS`."""
    if "--stop_signals" not in own:
        return STOP_SIGNALS
    names = [n.strip().upper() for n in own["--stop_signals"].split(",") if n.strip()]
    return tuple(signal.Signals[n if n.startswith("SIG") else f"SIG{n}"] for n in names)


def _install_stop_handlers(args: object, stops: tuple[signal.Signals, ...] = STOP_SIGNALS,
                           forced: bool = False) -> None:
    """Our handlers for the stop signals; torch's agent keeps its own for the others it was given. ``forced``
    (``--stop_signals``): also for a signal this launcher was started with ignored (Slurm's script ignores them
    until this handler is in place)."""
    ours = {sig.name for sig in stops}
    given = str(getattr(args, "signals_to_handle", TORCH_HANDLED_SIGNALS)).split(",")
    args.signals_to_handle = ",".join(s.strip() for s in given if s.strip() and s.strip() not in ours)  # type: ignore[attr-defined]
    for sig in stops:
        if signal.getsignal(sig) == signal.SIG_IGN and not forced:  # stays ignored here and in the workers
            continue
        signal.signal(sig, _on_stop_signal)


def _failed(failures: dict, nproc_per_node: int) -> int:
    rank, code = first_failure(failures)
    stopped_by = stop_signal()
    if code == EXIT_PREEMPTED:
        say(f"stopped on the exit signal after saving a checkpoint (exit code {EXIT_PREEMPTED}): start the job "
            "again to resume")
        return EXIT_PREEMPTED
    if code < 0:
        if stopped_by is not None and -code == stopped_by and "--stop_signals" in _OWN:
            say(f"stopped by {signal_name(stopped_by)}: a worker got it before it could handle it (while starting "
                "up, before any step of this job): nothing new to save")
        elif stopped_by is not None and -code == stopped_by:
            say(f"stopped by {signal_name(stopped_by)}: the workers did not handle it and were terminated (set "
                f"train.exit_signal_handler=true train.exit_signal={signal_name(stopped_by)} to save first)")
        else:
            say(f"error: {describe_failure(rank, code, nproc_per_node)}")
        return 128 - code
    if code not in (EXIT_USER_ERROR, EXIT_PEER_FAILURE):
        say(f"error: {describe_failure(rank, code, nproc_per_node)}; its output is above")
    return code if code > 0 else EXIT_CRASH


def _rendezvous_failed(args: object, exc: BaseException) -> int:
    endpoint = getattr(args, "rdzv_endpoint", "") or f"{getattr(args, 'master_addr', '')}:" \
        f"{getattr(args, 'master_port', '')}"
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    if "EADDRINUSE" in str(exc) or "address already in use" in str(exc).lower():
        say(f"error: node {getattr(args, 'node_rank', '?')} cannot host the rendezvous store at {endpoint}: the port "
            "is in use (another job on this node?); pick another --master_port (the same on every node)")
        return EXIT_USER_ERROR
    say(f"error: node {getattr(args, 'node_rank', '?')} could not meet the other nodes at {endpoint} within the "
        f"rendezvous timeout ({first}): start the same command on every node (--nnodes {getattr(args, 'nnodes', '?')}"
        ", one --node_rank each), check that node 0's address and port are reachable from here, or raise "
        "--rdzv_timeout")
    return EXIT_USER_ERROR


HEARTBEAT_S = 5.0
"""Seconds between two heartbeats (``--heartbeat_file``)."""


def start_heartbeat(path: str, every_s: float = HEARTBEAT_S) -> threading.Event:
    """A daemon thread that writes a growing count into ``path`` every ``every_s`` seconds while this launcher lives
    (set the returned event to stop it): the Slurm script stops a step whose node has not written one for
    ``--node_timeout`` seconds (by its own clock, not the file's time: the nodes' clocks may differ)."""
    stop = threading.Event()

    def beat() -> None:
        count = 0
        while not stop.is_set():
            count += 1
            _write_beat(path, f"{count}\n")
            stop.wait(every_s)

    threading.Thread(target=beat, name="mb-heartbeat", daemon=True).start()
    return stop


def end_heartbeat(path: str, beating: threading.Event, code: int | None) -> None:
    """The launcher ends: its last heartbeat says so (``ended CODE``), and the Slurm script stops watching this node.
    The node whose launcher died with it (killed whole) never writes it: that is the one it names as lost."""
    beating.set()
    _write_beat(path, f"ended {'?' if code is None else code}\n")


def _write_beat(path: str, text: str) -> None:
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    except OSError:
        pass  # a full or unreachable filesystem: the script will call this node silent, which it is


def quiet_cpp_logs() -> None:
    """torch's C++ log lines (a rendezvous that cannot connect prints each retry with ~20 C++ stack frames) off in
    this launcher: c10 reads ``TORCH_CPP_LOG_LEVEL`` once, when torch loads; the workers keep the level they were
    given (the variable is restored at once). Kept with --debug or a level already set."""
    if "torch" in sys.modules or "TORCH_CPP_LOG_LEVEL" in os.environ or debug_enabled() or DEBUG_FLAG in sys.argv:
        return
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    try:
        import torch  # noqa: F401
    finally:
        del os.environ["TORCH_CPP_LOG_LEVEL"]


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv``; returns the exit code described in the module docstring."""
    argv, own = take_own_flags(list(sys.argv[1:] if argv is None else argv))
    _OWN.clear()
    _OWN.update(own)
    beating = start_heartbeat(own["--heartbeat_file"]) if "--heartbeat_file" in own else None
    quiet_cpp_logs()
    import torch.distributed.launcher.api as launcher_api
    from torch.distributed.run import parse_args, run

    set_parent_death_signal(signal.SIGTERM)
    if not debug_enabled() and DEBUG_FLAG not in argv:
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    args = parse_args(argv)
    launcher_api.LocalElasticAgent = restart_policy_agent()  # torch's agent, with the restart policy
    request_nnodes(getattr(args, "nnodes", ""))
    _install_stop_handlers(args, stop_signals_of(own), forced="--stop_signals" in own)
    if "--stop_signals" in own:  # the workers catch them at start-up (launch.py's Slurm workers): none is lost
        hold_at_spawn(tuple(int(sig) for sig in stop_signals_of(own)))
    _OWN["node_rank"] = str(getattr(args, "node_rank", "?"))
    code = None
    try:
        code = _run(args, run)
        return code
    finally:  # a repeated stop signal while Python exits (its finalization restores the default action) is ignored
        for sig in stop_signals_of(own):
            signal.signal(sig, signal.SIG_IGN)
        if beating is not None:
            end_heartbeat(own["--heartbeat_file"], beating, code)


def _run(args: object, run: object) -> int:
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    try:
        run(args)  # type: ignore[operator]
    except ChildFailedError as exc:
        return _failed(exc.failures, _nproc_per_node(args))
    except SignalException as exc:
        say(f"stopped by {signal.Signals(exc.sigval).name}: the workers were terminated")
        return 128 + int(exc.sigval)
    except LaunchError as exc:  # the nodes disagree on their settings (launcher/node_agreement.py)
        say(f"error: {exc}")
        return EXIT_USER_ERROR
    except (RendezvousError, DistError, TimeoutError) as exc:
        return _rendezvous_failed(args, exc)
    if stop_signal() is not None:
        say(f"stopped by {signal_name(stop_signal())}: the workers ended cleanly (with train.exit_signal_handler "
            "they saved a checkpoint at one agreed step, or stopped before their first step with nothing new to "
            "save; start the job again to resume)")
    return 0


def _nproc_per_node(args: object) -> int:
    try:
        return int(getattr(args, "nproc_per_node", 1))
    except (TypeError, ValueError):  # "gpu", "auto": torch resolved it; ranks then map to nodes by that count
        return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


if __name__ == "__main__":
    sys.exit(main())
