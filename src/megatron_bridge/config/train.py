"""``cfg.train``, ``cfg.validation``, ``cfg.rng`` and ``cfg.profiling``: how long and how the loop runs."""

from dataclasses import dataclass, field
from typing import Literal

from megatron_bridge.config.declared import DeclaredFields


@dataclass(kw_only=True)
class TrainingConfig(DeclaredFields):
    """Batch sizes, run length and exit conditions of the training loop."""

    micro_batch_size: int = 1
    """Samples per forward/backward pass on one data-parallel rank."""
    global_batch_size: int = 8
    """Samples per optimizer step over all data-parallel ranks (micro-batches are accumulated to reach it)."""
    train_iters: int | None = None
    """Number of optimizer steps. Set exactly one of train_iters and train_samples."""
    train_samples: int | None = None
    """Number of training samples; the step count is train_samples // global_batch_size."""
    exit_interval: int | None = None
    """Stop (after a checkpoint save) when the step count is a multiple of this; None disables it."""
    exit_duration_in_mins: float | None = None
    """Stop (after a checkpoint save) once the run has lasted this many minutes; None disables it."""
    exit_signal_handler: bool = False
    """On exit_signal, save a checkpoint at the end of the current step and stop (all ranks at one agreed step; a
    signal during start-up stops before the first step). Slurm jobs of launch.py set it and also catch SIGTERM,
    SIGUSR1, SIGUSR2 and SIGINT (training/stop_signals.py)."""
    exit_signal: Literal["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2"] = "SIGTERM"
    """The signal that exit_signal_handler reacts to."""
    manual_gc: bool = False
    """Disable Python's automatic garbage collection and collect every manual_gc_interval steps instead."""
    manual_gc_interval: int = 0
    """With manual_gc: collect every this many steps (0 collects only at the start)."""


@dataclass(kw_only=True)
class ValidationConfig(DeclaredFields):
    """Periodic evaluation on the validation split."""

    eval_interval: int | None = None
    """Evaluate every this many steps (and at the end); None disables evaluation."""
    eval_iters: int = 10
    """Global batches per evaluation."""


@dataclass(kw_only=True)
class RNGConfig(DeclaredFields):
    """Random seeds."""

    seed: int = 1234
    """Seed of Python, NumPy and torch RNGs (model init and dropout); every rank uses the same seed."""


@dataclass(kw_only=True)
class ProfilingConfig(DeclaredFields):
    """The PyTorch profiler and memory snapshots."""

    use_pytorch_profiler: bool = False
    """Record a torch.profiler trace between profile_step_start and profile_step_end."""
    profile_step_start: int = 10
    """First step recorded by the profiler."""
    profile_step_end: int = 12
    """Step after the last one recorded by the profiler."""
    profile_ranks: list[int] = field(default_factory=lambda: [0])
    """Global ranks that profile."""
    record_shapes: bool = False
    """Record operator input shapes in the profiler trace."""
    record_memory_history: bool = False
    """Record CUDA allocator history from profile_step_start and dump a snapshot at profile_step_end (CUDA only;
    logged and skipped on CPU)."""
    memory_snapshot_path: str = "memory_snapshot.pickle"
    """Where the CUDA memory snapshot is written (rank suffix added)."""
    trace_dir: str | None = None
    """Folder for profiler traces (Chrome trace JSON per rank); None uses ./profile."""
    estimate_gpu: str | None = None
    """GPU the dry-run memory/time estimate is checked against (e.g. "h100", "b200"; the table in
    megatron_bridge/config/gpus.py); None means H100. launch.py's -g/--gpu wins over it."""
