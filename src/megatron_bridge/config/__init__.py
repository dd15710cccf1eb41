"""The config tree: typed, documented dataclasses, validation rules and YAML/override serialization.

This is the package's lowest floor: it imports no torch (nor anything heavy), so recipes, scripts and every other
layer (models, data, checkpoint, distributed, training) can import it. Megatron-Bridge's import path,
``megatron_bridge.training.config``, re-exports the same classes.
"""

from megatron_bridge.config.checkpoint import CheckpointConfig
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.data import DatasetConfig, TokenizerConfig
from megatron_bridge.config.distributed import (
    DistributedDataParallelConfig,
    DistributedInitConfig,
    FSDP2Config,
    FSDP2MixedPrecisionPolicy,
    FSDP2OffloadPolicy,
)
from megatron_bridge.config.logger import LoggerConfig
from megatron_bridge.config.mixed_precision import MixedPrecisionConfig
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.config.model_optimization import DistillationConfig, QuantizationConfig
from megatron_bridge.config.optimizer import OptimizerConfig, SchedulerConfig
from megatron_bridge.config.train import ProfilingConfig, RNGConfig, TrainingConfig, ValidationConfig


GPTDatasetConfig = DatasetConfig
"""Megatron-Bridge's name of the GPT pretraining dataset config (``cfg.dataset``): the same class."""


__all__ = [
    "CheckpointConfig",
    "ConfigContainer",
    "DatasetConfig",
    "DistillationConfig",
    "DistributedDataParallelConfig",
    "DistributedInitConfig",
    "GPTDatasetConfig",
    "FSDP2Config",
    "FSDP2MixedPrecisionPolicy",
    "FSDP2OffloadPolicy",
    "LoggerConfig",
    "MixedPrecisionConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ProfilingConfig",
    "QuantizationConfig",
    "RNGConfig",
    "SchedulerConfig",
    "TokenizerConfig",
    "TrainingConfig",
    "ValidationConfig",
]
