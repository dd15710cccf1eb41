"""``ConfigContainer``: the whole run configuration, and its lifecycle construct → finalize → validate.

* construct: recipes and users build and mutate the tree freely (``cfg.train.train_iters = 10``).
* ``finalize()``: resolves the mixed-precision preset and applies the few documented adjustments
  (each logged once, never silent). Idempotent.
* ``validate()``: the ``field_types`` rule (every field against its annotation), ``finalize()``, then every rule of
  :mod:`megatron_bridge.config.rules` (and ``rules_model``, ``rules_distributed``); all violations are reported
  together in one :class:`~megatron_bridge.errors.ConfigValidationError`.
"""

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from megatron_bridge.config.checkpoint import CheckpointConfig
from megatron_bridge.config.data import DatasetConfig, TokenizerConfig
from megatron_bridge.config.declared import DeclaredFields, config_root
from megatron_bridge.config.distributed import (
    DistributedDataParallelConfig,
    DistributedInitConfig,
    FSDP2Config,
)
from megatron_bridge.config.logger import LoggerConfig
from megatron_bridge.config.mixed_precision import MixedPrecisionConfig
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.config.model_optimization import DistillationConfig, QuantizationConfig
from megatron_bridge.config.optimizer import OptimizerConfig, SchedulerConfig
from megatron_bridge.config.train import ProfilingConfig, RNGConfig, TrainingConfig, ValidationConfig
from megatron_bridge.utils.dist_env import get_world_size


@config_root
@dataclass(kw_only=True)
class ConfigContainer(DeclaredFields):
    """Every setting of a pretraining run, one typed sub-config per concern."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The decoder architecture and its parallel layout."""
    train: TrainingConfig = field(default_factory=TrainingConfig)
    """Batch sizes, run length and exit conditions."""
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    """Periodic evaluation."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer and gradient clipping."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """Learning-rate and weight-decay schedule."""
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    """Training data."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """Tokenizer (data preparation and vocabulary size)."""
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    """Stdout and TensorBoard logging."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoint save and load."""
    dist: DistributedInitConfig = field(default_factory=DistributedInitConfig)
    """Process groups and backend selection."""
    ddp: DistributedDataParallelConfig = field(default_factory=DistributedDataParallelConfig)
    """Options of DDP and Megatron FSDP."""
    fsdp2: FSDP2Config = field(default_factory=FSDP2Config)
    """Options of PyTorch FSDP2."""
    mixed_precision: MixedPrecisionConfig | str | None = None
    """A preset name ("bf16_mixed", "fp16_mixed", "fp32", or an FP8/FP4 preset such as
    "bf16_with_fp8_current_scaling_mixed") or a MixedPrecisionConfig; None leaves the fields as set."""
    rng: RNGConfig = field(default_factory=RNGConfig)
    """Random seeds."""
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    """Profiler settings."""
    quantization: QuantizationConfig = field(default_factory=QuantizationConfig)
    """nvidia-modelopt quantization-aware training (off unless quantization.quant_cfg is set)."""
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    """Knowledge distillation from a teacher checkpoint (off unless distillation.teacher_checkpoint is set)."""

    # ----------------------------------------------------------------------------------------------- lifecycle
    def finalize(self) -> "ConfigContainer":
        """Resolve presets and apply the documented adjustments (each logged once). Idempotent; returns self."""
        from megatron_bridge.config.adjustments import apply_adjustments

        apply_adjustments(self)
        return self

    def validate(self, world_size: int | None = None) -> "ConfigContainer":
        """Type-check every field, finalize, then check every rule for ``world_size`` (default: the process
        group's, else ``WORLD_SIZE``, else 1). Raises ConfigValidationError naming every violated rule. Returns
        self."""
        from megatron_bridge.config.rule_set import check_rules

        ws = world_size if world_size is not None else get_world_size()
        check_rules(self, ws, only=("field_types",))  # adjustments and rules may assume well-typed values
        self.finalize()
        check_rules(self, ws)
        return self

    @classmethod
    def holding(cls, section: object) -> "ConfigContainer":
        """A default container with ``section`` (a DatasetConfig, TokenizerConfig, ...) in its place, to check the
        rules of that section where only it is at hand: ``enforce(ConfigContainer.holding(dataset_cfg), ...)``."""
        for f in fields(cls):
            if f.default_factory is type(section):  # type: ignore[comparison-overlap]
                return cls(**{f.name: section})
        raise TypeError(f"{type(section).__name__} is not a section of ConfigContainer")

    # ------------------------------------------------------------------------------------------ derived values
    def data_parallel_size(self, world_size: int | None = None) -> int:
        """Data-parallel size: world size / (TP × PP × CP)."""
        ws = world_size if world_size is not None else get_world_size()
        m = self.model
        return max(1, ws // (m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size))

    def num_microbatches(self, world_size: int | None = None) -> int:
        """Micro-batches accumulated per step on each data-parallel rank."""
        return self.train.global_batch_size // (self.train.micro_batch_size * self.data_parallel_size(world_size))

    @property
    def train_iters(self) -> int:
        """Number of optimizer steps (from train.train_iters, or train.train_samples // global_batch_size)."""
        if self.train.train_iters is not None:
            return self.train.train_iters
        if self.train.train_samples is not None:
            return self.train.train_samples // self.train.global_batch_size
        return 0

    @property
    def lr_decay_iters(self) -> int:
        """Steps of the learning-rate decay (scheduler.lr_decay_iters, else the run length)."""
        return self.scheduler.lr_decay_iters if self.scheduler.lr_decay_iters is not None else self.train_iters

    @property
    def lr_warmup_iters(self) -> int:
        """Warmup steps (scheduler.lr_warmup_iters, or lr_warmup_fraction × lr_decay_iters)."""
        if self.scheduler.lr_warmup_fraction is not None:
            return int(self.scheduler.lr_warmup_fraction * self.lr_decay_iters)
        return self.scheduler.lr_warmup_iters

    @property
    def mixed_precision_config(self) -> MixedPrecisionConfig | None:
        """The resolved mixed-precision config (None when unset)."""
        from megatron_bridge.config.mixed_precision import get_mixed_precision_preset

        if isinstance(self.mixed_precision, str):
            return get_mixed_precision_preset(self.mixed_precision)
        return self.mixed_precision

    # ------------------------------------------------------------------------------------------- serialization
    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict of the config (YAML-safe scalars, lists and dicts)."""
        from megatron_bridge.config.serialization import to_dict

        return to_dict(self)

    def to_yaml(self, path: str | Path | None = None) -> str:
        """The config as YAML text; also written to ``path`` when given."""
        from megatron_bridge.config.serialization import to_yaml

        return to_yaml(self, path)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ConfigContainer":
        """Build from a nested dict; unknown keys and wrong types raise ConfigOverrideError naming the key."""
        from megatron_bridge.config.serialization import from_dict

        return from_dict(cls, data)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "ConfigContainer":
        """Load a YAML file written by ``to_yaml`` (safe loader; no objects are instantiated from the file)."""
        from megatron_bridge.config.serialization import from_yaml

        return from_yaml(cls, path)

    def apply_overrides(
        self, yaml_path: str | Path | None = None, overrides: list[str] | None = None
    ) -> "ConfigContainer":
        """Return a new config: this one < the YAML file < ``key=value`` overrides (recipe < YAML < CLI)."""
        from megatron_bridge.config.serialization import apply_overrides

        return apply_overrides(self, yaml_path, overrides or [])
