"""``cfg.logger``: what is logged, where and how often.

The TensorBoard switches are Megatron-Bridge's (``LoggerConfig`` there, from megatron-core's training config), with
its defaults; docs/training/logging.md lists every tag each one writes.
"""

from dataclasses import dataclass
from typing import Literal

from megatron_bridge.config.declared import DeclaredFields


@dataclass(kw_only=True)
class LoggerConfig(DeclaredFields):
    """Stdout and TensorBoard logging of the training loop."""

    log_interval: int = 10
    """Print a log line (on the last rank) every this many steps; TensorBoard's ``iteration-time`` and
    ``throughput/tflops`` are written at these steps too (as in Megatron-Bridge)."""
    tensorboard_dir: str | None = None
    """Write TensorBoard scalars here (last rank only); None disables TensorBoard."""
    tensorboard_log_interval: int = 1
    """Write the per-step TensorBoard scalars every this many steps."""
    tensorboard_queue_size: int = 1000
    """Events TensorBoard's writer holds before it writes them to disk."""
    log_timers_to_tensorboard: bool = False
    """Write ``iteration-time`` (every ``log_interval`` steps) and the phase timers that ``timing_log_level`` turns on
    (``forward-backward-time``, ``optimizer-time``, ... every ``tensorboard_log_interval`` steps, the maximum over
    ranks) to TensorBoard (Megatron-Bridge's switch; its recipes turn it on, as ours do)."""
    timing_log_level: Literal[-1, 0, 1, 2] = 0
    """Which timers run (Megatron-Bridge's levels): -1 none, not even ``iteration-time``; 0 only the step time;
    1 also ``forward-backward`` and ``optimizer``; 2 also ``batch-generator``, ``forward-compute`` and
    ``backward-compute``. Levels 1 and 2 synchronize CUDA around each timed phase (slower steps on GPU) and print
    the timers on the stdout line. Differs from Megatron-Bridge in the normalizer (steps since the tag's previous
    write) and the stdout timers (the maximum over ranks only)."""
    log_throughput: bool = False
    """Print tokens/s and model TFLOP/s per device on the stdout line (Megatron-Bridge's switch and default)."""
    log_throughput_to_tensorboard: bool = False
    """Write ``throughput/*`` to TensorBoard: batches, samples and tokens per second (in all and per device, a rolling
    mean over ``throughput_window_size`` steps), the batch sizes, and model TFLOP/s every ``log_interval`` steps."""
    throughput_window_size: int = 100
    """Steps in the rolling mean of ``throughput/*_per_sec``; nothing is written before that many steps ran. Differs
    from Megatron-Bridge: the rate is exact over the window (Megatron-Bridge's full window counts one batch less)."""
    log_memory: bool = True
    """Print the peak memory on the stdout line (CUDA allocator peak, or peak RSS on CPU). This library's switch;
    TensorBoard's memory tags are ``log_memory_to_tensorboard``."""
    log_memory_to_tensorboard: bool = False
    """Write ``memory/*`` to TensorBoard (the maximum over ranks): on CUDA the ``torch.cuda.memory_stats()`` entries
    of ``memory_keys`` in gigabytes (10^9 bytes); on CPU the process's resident set size, now as
    ``memory/mem-allocated-gigabytes`` and at its peak as ``memory/mem-max-allocated-gigabytes``. Differs from
    Megatron-Bridge, which logs CUDA only and takes the maximum over the pipeline group."""
    memory_keys: dict[str, str] | None = None
    """``torch.cuda.memory_stats()`` key -> logged name (``bytes`` in a name becomes ``gigabytes``); None logs
    Megatron-Bridge's ten (``MEMORY_KEYS`` in src/megatron_bridge/training/tensorboard.py). On CPU only
    ``allocated_bytes.all.current`` and ``allocated_bytes.all.peak`` have a value (the resident set size)."""
    log_loss_scale_to_tensorboard: bool = True
    """Write ``loss-scale`` (1.0 without fp16) to TensorBoard."""
    log_world_size_to_tensorboard: bool = False
    """Write ``world-size`` (the number of processes) to TensorBoard."""
    log_validation_ppl_to_tensorboard: bool = False
    """Write ``lm loss validation ppl`` beside ``lm loss validation`` to TensorBoard."""
    log_runtime_to_tensorboard: bool = False
    """Write ``time/*`` to TensorBoard: consumed ``time/tokens``, ``time/samples`` and ``time/batches``, the wall time
    since training started (``time/total``) and ``time/remaining_estimate`` (that time scaled to
    ``train.train_iters``, as Megatron-Bridge estimates it: steps restored from a checkpoint count as done)."""
    runtime_time_unit: Literal["seconds", "minutes", "hours", "days"] = "hours"
    """Unit of ``time/total`` and ``time/remaining_estimate``."""
    skip_train_metrics_log: bool = False
    """Log no training step at all: no stdout line, no per-step TensorBoard scalar (evaluation is still logged)."""
    log_params_norm: bool = False
    """Compute the L2 norm of all parameters every step (a pass over the weights) and log it (stdout and
    ``params-norm``)."""
    log_progress: bool = True
    """Show a progress bar when stderr is an interactive terminal. Differs from Megatron-Bridge, where the switch
    writes ``progress.txt`` (tokens and FLOPs so far) into the checkpoint folder."""
    logging_level: str = "INFO"
    """Level of the megatron_bridge loggers (DEBUG, INFO, WARNING, ...)."""
    save_config_filepath: str | None = None
    """Write the validated config as YAML here at start; None skips it."""
