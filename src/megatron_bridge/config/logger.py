"""``cfg.logger``: what is logged, where and how often."""

from dataclasses import dataclass


@dataclass(kw_only=True)
class LoggerConfig:
    """Stdout and TensorBoard logging of the training loop."""

    log_interval: int = 10
    """Print a log line (on the last rank) every this many steps."""
    tensorboard_dir: str | None = None
    """Write TensorBoard scalars here (last rank only); None disables TensorBoard."""
    tensorboard_log_interval: int = 1
    """Write TensorBoard scalars every this many steps."""
    log_throughput: bool = True
    """Log tokens/s and model TFLOP/s per device."""
    log_memory: bool = True
    """Log peak and current memory (CUDA allocator, or process RSS on CPU)."""
    log_params_norm: bool = False
    """Log the L2 norm of all parameters (costs a pass over the weights)."""
    log_progress: bool = True
    """Show a progress bar when stdout is an interactive terminal."""
    logging_level: str = "INFO"
    """Level of the megatron_bridge loggers (DEBUG, INFO, WARNING, ...)."""
    save_config_filepath: str | None = None
    """Write the validated config as YAML here at start; None skips it."""
