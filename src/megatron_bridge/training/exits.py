"""Exit conditions checked after every step: signals, wall-clock duration, exit_interval and train_iters.

Decisions that depend on per-rank facts (a signal received, elapsed time) are MAX-reduced over all ranks so every
rank stops at the same step.
"""

import signal
import time
from types import FrameType

import torch
import torch.distributed as dist

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)


class ExitConditions:
    """Tracks the run's exit conditions; ``check(step)`` returns the reason to stop, or None."""

    def __init__(self, cfg: ConfigContainer, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.start_time = time.time()
        self.signal_received = False
        self._previous_handler: object = None
        self._signum: int | None = None
        if cfg.train.exit_signal_handler:
            self._signum = int(getattr(signal, cfg.train.exit_signal))
            self._previous_handler = signal.signal(self._signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        logger.warning("received signal %s: saving a checkpoint and exiting after this step", signum)
        self.signal_received = True

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
        """Restore the previous signal handler."""
        if self._signum is not None:
            signal.signal(self._signum, self._previous_handler)  # type: ignore[arg-type]
            self._signum = None


def _max_over_ranks(values: list[float], device: torch.device) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()
