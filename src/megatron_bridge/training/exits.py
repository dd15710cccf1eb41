"""Exit conditions checked after every step: signals, wall-clock duration, exit_interval and train_iters.

Decisions that depend on per-rank facts (a signal received, elapsed time) are MAX-reduced over all ranks so every
rank stops at the same step. Signals are remembered by :mod:`megatron_bridge.training.stop_signals` from the moment
they are caught (also before this object exists: a Slurm job's workers catch them at start-up), and a signal that came
before the first step stops the job before it (:meth:`ExitConditions.check_before_first_step`).
"""

import time

import torch
import torch.distributed as dist

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.training import stop_signals
from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)


class ExitConditions:
    """Tracks the run's exit conditions; ``check(step)`` returns the reason to stop, or None."""

    def __init__(self, cfg: ConfigContainer, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.start_time = time.time()
        self._caught: list[str] = []
        if cfg.train.exit_signal_handler:
            self._caught = stop_signals.catch([cfg.train.exit_signal])

    @property
    def signal_received(self) -> bool:
        """True once this rank caught a stop signal (``train.exit_signal``, or a scheduler's: stop_signals.py)."""
        return stop_signals.received() is not None

    def check_before_first_step(self) -> str | None:
        """"signal" when a rank caught a stop signal before the first step of this job (during start-up, data
        loading or the checkpoint load): the job stops before training, with nothing new to save; else None."""
        if not self.cfg.train.exit_signal_handler:
            return None
        return "signal" if _max_over_ranks([float(self.signal_received)], self.device)[0] else None

    def check(self, step: int) -> str | None:
        """The reason to stop after ``step`` ("signal", "duration", "exit_interval", "train_iters") or None."""
        t = self.cfg.train
        flags = [0.0, 0.0]
        if t.exit_signal_handler:
            flags[0] = float(self.signal_received)
        if t.exit_duration_in_mins is not None:
            flags[1] = float((time.time() - self.start_time) / 60.0 > t.exit_duration_in_mins)
        if t.exit_signal_handler or t.exit_duration_in_mins is not None:
            flags = _max_over_ranks(flags, self.device)
        if flags[0]:
            return "signal"
        if flags[1]:
            return "duration"
        if t.exit_interval is not None and step % t.exit_interval == 0:
            return "exit_interval"
        if step >= self.cfg.train_iters:
            return "train_iters"
        return None

    def close(self) -> None:
        """Restore the previous signal handler and forget the signal (a later run in this process starts afresh)."""
        if self._caught:
            stop_signals.release(self._caught)
            self._caught = []
        stop_signals.forget()


def stop_requested_on_any_rank(cfg: ConfigContainer, device: torch.device) -> bool:
    """With ``train.exit_signal_handler``: whether any rank caught a stop signal already (during start-up, before
    the model is built: the job stops there); one MAX-reduction. False without the handler (no collective)."""
    if not cfg.train.exit_signal_handler:
        return False
    return bool(_max_over_ranks([float(stop_signals.received() is not None)], device)[0])


def _max_over_ranks(values: list[float], device: torch.device) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()
