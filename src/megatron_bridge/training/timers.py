"""Wall-clock timers: the step timer, and the phase timers that ``logger.timing_log_level`` switches on.

A phase timer has Megatron-Bridge's name and level (:data:`TIMER_LEVELS`); a timer whose level is above
``logger.timing_log_level`` costs nothing (a null context). An active timer synchronizes CUDA when it starts and stops
(as megatron-core's timers do), which is why levels 1 and 2 can slow a step; on CPU it only reads the clock.
Readers (TensorBoard, the stdout line) each take the mean seconds per step since their own last read, so the two
never reset each other's window.
"""

import time

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


class PhaseTimer:
    """One phase timer: the body of ``with timers(name):``, or Megatron-Bridge's ``timers(name).start()`` ...
    ``timers(name).stop()``; each start-stop pair adds its seconds to the phase's total."""

    def __init__(self, totals: dict[str, float], name: str, device: torch.device) -> None:
        self._totals, self.name, self._device = totals, name, device
        self._started: float | None = None

    def start(self, barrier: bool = False) -> None:
        """Start timing (``barrier`` is accepted for Megatron-Bridge's signature; timers here never barrier)."""
        _sync(self._device)
        self._started = time.perf_counter()

    def stop(self, barrier: bool = False) -> None:
        """Stop timing and add the seconds since :meth:`start` (nothing when it was not started)."""
        if self._started is None:
            return
        _sync(self._device)
        self._totals[self.name] += time.perf_counter() - self._started
        self._started = None

    def __enter__(self) -> None:
        self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _NullTimer(PhaseTimer):
    """A timer above ``logger.timing_log_level``: measures nothing."""

    def __init__(self) -> None:
        super().__init__({}, "", torch.device("cpu"))

    def start(self, barrier: bool = False) -> None:
        """Nothing to time."""

    def stop(self, barrier: bool = False) -> None:
        """Nothing to time."""


_NULL_TIMER = _NullTimer()


class PhaseTimers:
    """The phase timers of one rank: ``with timers("optimizer"): ...`` accumulates seconds when the level allows;
    Megatron-Bridge's ``state.timers("batch-generator", log_level=2).start()`` / ``.stop()`` works too."""

    def __init__(self, level: int, device: torch.device) -> None:
        self.device = device
        self.names = [name for name, lvl in TIMER_LEVELS.items() if lvl <= level]
        """The timers measured at this level, in :data:`TIMER_LEVELS` order (none at levels 0 and -1)."""
        self._totals = dict.fromkeys(self.names, 0.0)
        self._timers = {name: PhaseTimer(self._totals, name, device) for name in self.names}
        self._steps = 0
        self._read: dict[str, tuple[dict[str, float], int]] = {}

    def __call__(self, name: str, log_level: int | None = None) -> PhaseTimer:
        """The timer ``name`` (a key of :data:`TIMER_LEVELS`), or one that measures nothing at a lower level.
        ``log_level`` is accepted for Megatron-Bridge's signature; each phase keeps its own level."""
        if name not in self._timers:
            if name not in TIMER_LEVELS:
                raise KeyError(f"unknown timer {name!r}; known: {sorted(TIMER_LEVELS)}")
            return _NULL_TIMER
        return self._timers[name]

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
