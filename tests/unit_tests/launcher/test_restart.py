"""The restart policy's pieces: which failure is reported (rank, node, signal), the no-restart mark in the rendezvous
store, the launcher's exit codes and stop-signal handling."""

import argparse
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest

from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.launcher import restart, torchrun
from megatron_bridge.launcher.restart import await_first_error, describe_failure, first_failure
from megatron_bridge.training import job
from megatron_bridge.training.job import NO_RESTART_KEY, forbid_restart_after
from megatron_bridge.utils.cli import EXIT_PREEMPTED


def _failures(**codes: int) -> dict[int, SimpleNamespace]:
    """rank -> failure; ``r1=-9`` is rank 1 killed by SIGKILL; all at the same second (torch's resolution)."""
    return {int(k[1:]): SimpleNamespace(exitcode=v, timestamp=100) for k, v in codes.items()}


def test_a_killed_rank_is_named_even_when_a_peer_was_seen_first() -> None:
    # issue 27 item 5: a SIGKILLed (pipeline) rank used to lose against its peer's "another rank failed" (code 3)
    assert first_failure(_failures(r0=3, r1=-signal.SIGKILL)) == (1, -signal.SIGKILL)
    assert first_failure(_failures(r1=-signal.SIGKILL, r0=3)) == (1, -signal.SIGKILL)


def test_a_workers_own_error_wins_and_sigterm_comes_last() -> None:
    assert first_failure(_failures(r0=3, r1=-signal.SIGKILL, r2=1)) == (2, 1)
    # torch's agent SIGTERMs the ranks still running once one failed: the failed one is the story
    assert first_failure(_failures(r0=3, r1=-signal.SIGTERM)) == (0, 3)
    assert first_failure(_failures(r1=-signal.SIGTERM)) == (1, -signal.SIGTERM)


def _exiting(code: int, after_s: float = 0.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-S", "-c", f"import time, os; time.sleep({after_s}); os._exit({code})"])


def test_the_agent_waits_for_the_failure_that_stopped_a_peer() -> None:
    # rank 0 stopped because rank 1 failed (code 3), rank 1 is still exiting: its own code 2 is the one to see
    peer, failing = _exiting(3), _exiting(2, after_s=0.5)
    peer.wait()
    started = time.monotonic()
    await_first_error({0: peer, 1: failing}, grace_s=30)
    assert failing.poll() == 2
    assert time.monotonic() - started < 20


def test_a_hung_rank_costs_only_the_grace_and_other_failures_none() -> None:
    peer, hung = _exiting(3), _exiting(0, after_s=60)
    try:
        peer.wait()
        started = time.monotonic()
        await_first_error({0: peer, 1: hung}, grace_s=0.3)
        assert 0.3 <= time.monotonic() - started < 10 and hung.poll() is None
        crashed = _exiting(1)
        crashed.wait()
        started = time.monotonic()
        await_first_error({0: peer, 1: hung, 2: crashed}, grace_s=30)  # a worker's own error is already there
        await_first_error({1: hung, 2: crashed}, grace_s=30)  # no rank stopped because of another
        assert time.monotonic() - started < 10
    finally:
        hung.kill()
        hung.wait()


def test_describe_failure_names_rank_node_and_signal() -> None:
    text = describe_failure(5, -signal.SIGKILL, nproc_per_node=2)
    assert text.startswith("rank 5 (node 2, host ") and text.endswith("was killed by SIGKILL")
    assert describe_failure(1, 7, nproc_per_node=4).startswith("rank 1 (node 0, host ")
    assert describe_failure(1, 7, nproc_per_node=4).endswith("exited with code 7")


def test_launcher_exit_codes_and_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert torchrun._failed(_failures(r0=3, r3=-signal.SIGKILL), nproc_per_node=2) == 128 + signal.SIGKILL
    assert "error: rank 3 (node 1, host" in capsys.readouterr().err
    assert torchrun._failed(_failures(r0=2, r1=3), nproc_per_node=2) == 2
    assert capsys.readouterr().err == ""  # the worker printed its own error line
    assert torchrun._failed(_failures(r0=EXIT_PREEMPTED, r1=EXIT_PREEMPTED), nproc_per_node=2) == EXIT_PREEMPTED
    assert "start the job again to resume" in capsys.readouterr().err


def test_stop_signals_are_taken_from_torchs_list() -> None:
    args = argparse.Namespace(signals_to_handle="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1")
    previous = {sig: signal.getsignal(sig) for sig in torchrun.STOP_SIGNALS}
    try:
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # started ignored (Slurm's script): stays ignored
        torchrun._install_stop_handlers(args)
        assert args.signals_to_handle == "SIGINT,SIGHUP,SIGQUIT"
        assert signal.getsignal(signal.SIGTERM) is signal.getsignal(signal.SIGUSR1) is torchrun._on_stop_signal
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _server():  # noqa: ANN202
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10))


def test_a_project_error_marks_the_job_not_restartable(monkeypatch: pytest.MonkeyPatch) -> None:
    server = _server()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    forbid_restart_after(ConfigValidationError("train.x=1 is bad"))  # no restart budget: nothing to tell
    assert not server.check([NO_RESTART_KEY])
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    forbid_restart_after(RuntimeError("a crash may go away"))
    assert not server.check([NO_RESTART_KEY])
    forbid_restart_after(ConfigValidationError("train.x=1 is bad"))
    assert server.get(NO_RESTART_KEY).decode() == "error: train.x=1 is bad"


def test_forbid_restart_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job, "STORE_TIMEOUT_S", 1)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")  # nobody listens
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    job.forbid_restart("reason")


def test_rendezvous_failures_are_one_named_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(rdzv_endpoint="", master_addr="10.0.0.1", master_port=29500, node_rank=1, nnodes=2)
    assert torchrun._rendezvous_failed(args, TimeoutError("The client socket has timed out\nframe #0")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: node 1 could not meet the other nodes at 10.0.0.1:29500")
    assert torchrun._rendezvous_failed(args, RuntimeError("listen failed, EADDRINUSE")) == 2
    assert "the port is in use" in capsys.readouterr().err


def test_the_wrappers_own_flags_are_taken_out_before_torchs() -> None:
    argv = ["--stop_signals=SIGTERM,USR1,SIGUSR2,SIGINT", "--stop_file=/run/slurm-7.stop", "--nnodes=2",
            "script.py", "--stop_file=/kept"]
    rest, own = torchrun.take_own_flags(argv)
    assert rest == ["--nnodes=2", "script.py", "--stop_file=/kept"]  # the script's own arguments stay
    assert own == {"--stop_signals": "SIGTERM,USR1,SIGUSR2,SIGINT", "--stop_file": "/run/slurm-7.stop"}
    assert torchrun.stop_signals_of(own) == (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)
    assert torchrun.stop_signals_of({}) == torchrun.STOP_SIGNALS


def test_forced_stop_signals_are_handled_even_when_started_ignored(tmp_path) -> None:  # noqa: ANN001
    """Slurm's script starts the launcher with the stop signals ignored; --stop_signals handles them all (SIGINT too)
    and records the first in --stop_file."""
    stops = torchrun.stop_signals_of({"--stop_signals": "TERM,USR1,USR2,INT"})
    args = argparse.Namespace(signals_to_handle="SIGHUP,SIGQUIT,SIGINT")
    previous = {sig: signal.getsignal(sig) for sig in stops}
    torchrun._OWN.update({"--stop_signals": "TERM,USR1,USR2,INT", "--stop_file": str(tmp_path / "stop")})
    try:
        for sig in stops:
            signal.signal(sig, signal.SIG_IGN)
        torchrun._install_stop_handlers(args, stops, forced=True)
        assert args.signals_to_handle == "SIGHUP,SIGQUIT"
        assert all(signal.getsignal(sig) is torchrun._on_stop_signal for sig in stops)
        torchrun._on_stop_signal(signal.SIGUSR1, None)
        torchrun._on_stop_signal(signal.SIGTERM, None)  # a repeat (srun's step kill): ignored
        assert (tmp_path / "stop").read_text() == "SIGUSR1 node ?\n" and restart.stop_signal() == signal.SIGUSR1
    finally:
        torchrun._OWN.clear()
        restart._STOP_SIGNAL = None
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_catches_reads_the_handled_signals_of_a_process() -> None:
    previous = signal.signal(signal.SIGUSR2, lambda *_: None)
    try:
        assert restart.catches(os.getpid(), signal.SIGUSR2)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert not restart.catches(os.getpid(), signal.SIGUSR2) and not restart.catches(2**22 + 7, signal.SIGTERM)
