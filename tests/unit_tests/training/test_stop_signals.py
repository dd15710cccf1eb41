"""Stop signals are remembered from the moment they are caught: a signal before the first step stops the job before
it with nothing new to save; one in the middle saves at the step reached; any scheduler signal works, whatever
train.exit_signal says (training/stop_signals.py, training/exits.py). One process, the tiny Llama, a few steps."""

import os
import signal
import threading
from pathlib import Path

import pytest

from megatron_bridge.recipes import tiny_llama_pretrain_config
from megatron_bridge.training import stop_signals
from megatron_bridge.training.callbacks import Callback
from megatron_bridge.training.pretrain import pretrain


pytestmark = pytest.mark.timeout(120)


def _config(tmp_path: Path):  # noqa: ANN202
    cfg = tiny_llama_pretrain_config(train_iters=6, global_batch_size=2, micro_batch_size=2, seq_length=32,
                                     eval_interval=None, lr_warmup_iters=1, log_interval=1)
    cfg.checkpoint.save, cfg.checkpoint.load, cfg.checkpoint.save_interval = str(tmp_path / "ck"), None, 100
    cfg.train.exit_signal_handler, cfg.train.exit_signal = True, "SIGTERM"
    return cfg


class SignalAt(Callback):
    """Sends this process ``sig`` at the end of step ``step``."""

    def __init__(self, step: int, sig: int) -> None:
        self.step, self.sig = step, sig

    def on_train_step_end(self, ctx, **kwargs) -> None:  # noqa: ANN001, ANN003
        if ctx.train_state.step == self.step:
            os.kill(os.getpid(), self.sig)


@pytest.fixture(autouse=True)
def _scheduler_signals():  # noqa: ANN202
    """As a Slurm job's worker: every scheduler stop signal caught before pretrain()."""
    stop_signals.forget()
    caught = stop_signals.catch(stop_signals.SCHEDULER_STOP_SIGNALS)
    yield
    stop_signals.release(caught)
    stop_signals.forget()


def _latest(tmp_path: Path) -> str | None:
    path = tmp_path / "ck" / "latest_checkpointed_iteration.txt"
    return path.read_text().strip() if path.exists() else None


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT], ids=lambda s: s.name)
def test_any_scheduler_signal_saves_at_the_step_reached(tmp_path: Path, sig: signal.Signals) -> None:
    result = pretrain(_config(tmp_path), callbacks=[SignalAt(2, sig)])  # train.exit_signal is SIGTERM
    assert (result.exit_reason, result.final_step) == ("signal", 2)
    assert _latest(tmp_path) == "2"
    assert stop_signals.received() is None  # forgotten when the run closed: a later run starts afresh


def test_a_signal_before_the_first_step_stops_before_it_with_nothing_to_save(tmp_path: Path) -> None:
    os.kill(os.getpid(), signal.SIGUSR1)  # during start-up: before pretrain() built anything
    assert stop_signals.received_name() == "SIGUSR1"
    cfg = _config(tmp_path)
    result = pretrain(cfg)  # stops before the model is built
    assert (result.exit_reason, result.final_step, result.losses) == ("signal", 0, [])
    assert _latest(tmp_path) is None  # nothing new to save
    from megatron_bridge.perf.results import build_results, join_slices, summary_line

    empty = build_results(cfg, result, device_name=None)  # launch.py writes this slice; the next job's slice joins it
    assert summary_line(empty).startswith("SUMMARY") and join_slices(empty, empty)["steps"] == 0


def test_without_a_signal_the_run_ends_at_train_iters(tmp_path: Path) -> None:
    result = pretrain(_config(tmp_path))
    assert (result.exit_reason, result.final_step) == ("train_iters", 6)


def test_a_signal_held_pending_at_start_up_arrives_when_caught() -> None:
    """A Slurm job's launcher starts its workers with the stop signals blocked (restart.hold_at_spawn): one sent
    during start-up is pending, neither lost nor fatal, and arrives when the worker catches it."""
    stop_signals.release(stop_signals.SCHEDULER_STOP_SIGNALS)  # as a worker before it caught anything
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
    try:
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR2)  # to this thread (others do not block it)
        assert stop_signals.received() is None and signal.SIGUSR2 in signal.sigpending()
        stop_signals.catch(["SIGUSR2"])
        assert stop_signals.received_name() == "SIGUSR2"
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
