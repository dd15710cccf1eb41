"""Wall-clock timers: the step timer, and the phase timers that ``logger.timing_log_level`` switches on.

A phase timer has Megatron-Bridge's name and level (:data:`TIMER_LEVELS`); a timer whose level is above
``logger.timing_log_level`` costs nothing (a null context). An active timer synchronizes CUDA when it starts and stops
(as megatron-core's timers do), which is why levels 1 and 2 can slow a step; on CPU it only reads the clock.
Readers (TensorBoard, the stdout line) each take the mean seconds per step since their own last read, so the two
never reset each other's window.
"""

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
import torch.distributed as dist


TIMER_LEVELS: dict[str, int] = {
    "forward-backward": 1,
    "optimizer": 1,
    "batch-generator": 2,
    "forward-compute": 2,
    "backward-compute": 2,
}
"""Phase timers and the ``logger.timing_log_level`` from which each is measured (Megatron-Bridge's levels):
``forward-backward`` every micro-batch's forward and backward and the gradient reduction; ``optimizer`` the
optimizer step (clipping included); ``batch-generator`` reading the step's micro-batches; ``forward-compute`` and
``backward-compute`` each micro-batch's forward (with its loss) and backward (not under pipeline parallelism, whose
schedule interleaves them)."""


class Timer:
    """Wall-clock timer that synchronizes CUDA before reading, so step times are real."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.start = 0.0

    def reset(self) -> None:
        """Start timing now."""
        _sync(self.device)
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds since ``reset``."""
        _sync(self.device)
        return time.perf_counter() - self.start


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PhaseTimers:
    """The phase timers of one rank: ``with timers("optimizer"): ...`` accumulates seconds when the level allows."""

    def __init__(self, level: int, device: torch.device) -> None:
        self.device = device
        self.names = [name for name, lvl in TIMER_LEVELS.items() if lvl <= level]
        """The timers measured at this level, in :data:`TIMER_LEVELS` order (none at levels 0 and -1)."""
        self._totals = dict.fromkeys(self.names, 0.0)
        self._steps = 0
        self._read: dict[str, tuple[dict[str, float], int]] = {}

    def __call__(self, name: str) -> AbstractContextManager[None]:
        """Time the ``with`` body under ``name`` (a key of :data:`TIMER_LEVELS`), or do nothing at a lower level."""
        if name not in self._totals:
            if name not in TIMER_LEVELS:
                raise KeyError(f"unknown timer {name!r}; known: {sorted(TIMER_LEVELS)}")
            return nullcontext()
        return self._timed(name)

    @contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        _sync(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            _sync(self.device)
            self._totals[name] += time.perf_counter() - start

    def end_step(self) -> None:
        """Count a finished step (the readers' normalizer)."""
        self._steps += 1

    def window(self, reader: str) -> dict[str, float]:
        """Mean seconds per step of each active timer since ``reader``'s previous call (or since the start)."""
        totals, steps = self._read.get(reader, (dict.fromkeys(self.names, 0.0), 0))
        count = max(self._steps - steps, 1)
        self._read[reader] = (dict(self._totals), self._steps)
        return {name: (self._totals[name] - totals[name]) / count for name in self.names}


def max_over_ranks(values: list[float], device: torch.device) -> list[float]:
    """Element-wise maximum over all ranks (one all-reduce; none in one process or for an empty list)."""
    if not values or not dist.is_initialized() or dist.get_world_size() == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()
