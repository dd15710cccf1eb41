"""Shared pretraining defaults (one place) and the keyword overrides every recipe accepts.

A recipe is a plain function returning a :class:`ConfigContainer`: it starts from :func:`pretrain_common`, states
only what differs for its model, then applies :func:`apply_common_overrides` for the keyword arguments.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from megatron_bridge.config.checkpoint import CheckpointConfig
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.data import DatasetConfig, TokenizerConfig
from megatron_bridge.config.distributed import DistributedDataParallelConfig
from megatron_bridge.config.logger import LoggerConfig
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.config.optimizer import OptimizerConfig, SchedulerConfig
from megatron_bridge.config.train import RNGConfig, TrainingConfig, ValidationConfig
from megatron_bridge.errors import ConfigValidationError


@dataclass(frozen=True)
class RecipeInfo:
    """A registered recipe and the world size its parallel layout is meant for."""

    fn: Callable[..., ConfigContainer]
    world_size: int


DEFAULT_RUN_DIR = os.path.join("nemo_experiments", "default")
"""The run folder of a recipe called without ``dir``, under the working directory (Megatron-Bridge's default):
checkpoints in ``<run>/checkpoints`` (saved and resumed), TensorBoard in ``<run>/tb_logs``."""


def default_run_dir() -> str:
    """``<cwd>/nemo_experiments/default``, resolved when the recipe is called (as Megatron-Bridge does)."""
    return os.path.join(os.getcwd(), DEFAULT_RUN_DIR)


def set_run_dir(cfg: ConfigContainer, run_dir: str) -> None:
    """Checkpoints (save and resume) in ``<run_dir>/checkpoints``, TensorBoard in ``<run_dir>/tb_logs``."""
    cfg.checkpoint.save = cfg.checkpoint.load = os.path.join(run_dir, "checkpoints")
    cfg.logger.tensorboard_dir = os.path.join(run_dir, "tb_logs")


def pretrain_common(model: ModelConfig) -> ConfigContainer:
    """Megatron-Bridge's Llama 3 pretrain defaults (reference §4) around ``model``: mock data, bf16 mixed precision,
    AdamW 3e-4 → 3e-5 cosine with 2000 warmup steps, distributed optimizer, DDP with overlapped communication, and
    the default run folder (:func:`default_run_dir`; a recipe's ``dir`` keyword replaces it).

    A model with TP > 1 gets ``dist.use_torch_fsdp2=True``: FSDP2 shards the optimizer state as Megatron-Bridge's
    distributed optimizer does, which the DDP backend does not do with TP (see docs/megatron-bridge-differences.md)."""
    cfg = ConfigContainer(
        model=model,
        train=TrainingConfig(train_iters=1_168_251, global_batch_size=512, micro_batch_size=1, manual_gc=True,
                             manual_gc_interval=100),
        validation=ValidationConfig(eval_interval=2000, eval_iters=32),
        optimizer=OptimizerConfig(optimizer="adam", lr=3e-4, min_lr=3e-5, weight_decay=0.1, adam_beta1=0.9,
                                  adam_beta2=0.95, adam_eps=1e-8, clip_grad=1.0, use_distributed_optimizer=True),
        scheduler=SchedulerConfig(lr_warmup_iters=2000, lr_decay_style="cosine", start_weight_decay=0.033,
                                  end_weight_decay=0.033, weight_decay_incr_style="constant",
                                  override_opt_param_scheduler=True),
        dataset=DatasetConfig(mock=True, seq_length=model.seq_length, split="9999,8,2", random_seed=1234),
        tokenizer=TokenizerConfig(tokenizer_type="null", vocab_size=model.vocab_size),
        logger=LoggerConfig(log_interval=10, log_timers_to_tensorboard=True),
        checkpoint=CheckpointConfig(save_interval=500, ckpt_format="torch_dist"),
        ddp=DistributedDataParallelConfig(check_for_nan_in_grad=True, grad_reduce_in_fp32=True,
                                          overlap_grad_reduce=True, overlap_param_gather=True,
                                          average_in_collective=True, use_distributed_optimizer=True),
        mixed_precision="bf16_mixed",
        rng=RNGConfig(seed=1234),
    )
    cfg.dist.use_torch_fsdp2 = model.tensor_model_parallel_size > 1
    set_run_dir(cfg, default_run_dir())
    return cfg


@dataclass(frozen=True)
class _Knob:
    path: str
    doc: str


COMMON_OVERRIDES: dict[str, _Knob] = {
    "train_iters": _Knob("train.train_iters", "optimizer steps"),
    "global_batch_size": _Knob("train.global_batch_size", "samples per step"),
    "micro_batch_size": _Knob("train.micro_batch_size", "samples per forward pass"),
    "lr": _Knob("optimizer.lr", "peak learning rate"),
    "min_lr": _Knob("optimizer.min_lr", "final learning rate"),
    "lr_warmup_iters": _Knob("scheduler.lr_warmup_iters", "warmup steps"),
    "tensor_model_parallel_size": _Knob("model.tensor_model_parallel_size", "TP"),
    "pipeline_model_parallel_size": _Knob("model.pipeline_model_parallel_size", "PP"),
    "virtual_pipeline_model_parallel_size": _Knob("model.virtual_pipeline_model_parallel_size", "VP"),
    "context_parallel_size": _Knob("model.context_parallel_size", "CP"),
    "expert_model_parallel_size": _Knob("model.expert_model_parallel_size", "EP (mixture-of-experts models)"),
    "sequence_parallel": _Knob("model.sequence_parallel", "sequence parallelism"),
    "mixed_precision": _Knob("mixed_precision", "preset name"),
    "use_torch_fsdp2": _Knob("dist.use_torch_fsdp2", "PyTorch FSDP2 backend"),
    "eval_interval": _Knob("validation.eval_interval", "steps between evaluations"),
    "log_interval": _Knob("logger.log_interval", "steps between log lines"),
}
"""Keyword overrides every recipe accepts, besides ``dir``, ``seq_length``, ``data_path`` and
``use_megatron_fsdp`` (handled by apply_common_overrides)."""
NONE_MEANS_SOMETHING = frozenset({"eval_interval", "virtual_pipeline_model_parallel_size", "mixed_precision"})
"""Keywords whose field takes None as a value of its own (no evaluation, no virtual pipeline stages, fp32), as in
Megatron-Bridge's recipes: given as None, they set it. For every other keyword None means "the recipe's value"."""


def apply_common_overrides(cfg: ConfigContainer, **overrides: Any) -> ConfigContainer:
    """Apply recipe keyword overrides. A keyword given as None sets its field to None where that means something
    (:data:`NONE_MEANS_SOMETHING`: ``eval_interval=None`` turns evaluation off) and is ignored otherwise (``dir=None``
    keeps the default run folder, ``train_iters=None`` the recipe's steps).

    ``dir``: run folder (checkpoints in <dir>/checkpoints, TensorBoard in <dir>/tb_logs);
    ``seq_length``: model and dataset sequence length; ``data_path``: indexed data prefixes (turns mock off);
    ``use_megatron_fsdp``: the Megatron FSDP overrides of :func:`megatron_bridge.recipes.perf.megatron_fsdp_overrides`
    (imported lazily); every key of ``COMMON_OVERRIDES``.
    """
    for key, value in overrides.items():
        if value is None and key not in NONE_MEANS_SOMETHING:
            continue
        if key == "dir":
            set_run_dir(cfg, value)
        elif key == "seq_length":
            cfg.model.seq_length = cfg.dataset.seq_length = value
        elif key == "lr_warmup_iters":
            cfg.scheduler.lr_warmup_iters, cfg.scheduler.lr_warmup_fraction = value, None
        elif key == "data_path":
            cfg.dataset.mock, cfg.dataset.data_path = False, list(value)
        elif key == "use_megatron_fsdp":
            if value:
                from megatron_bridge.recipes.perf import megatron_fsdp_overrides

                megatron_fsdp_overrides(cfg)
        elif key in COMMON_OVERRIDES:
            *parents, leaf = COMMON_OVERRIDES[key].path.split(".")
            target: Any = cfg
            for p in parents:
                target = getattr(target, p)
            setattr(target, leaf, value)
        else:
            known = sorted([*COMMON_OVERRIDES, "dir", "seq_length", "data_path", "use_megatron_fsdp"])
            raise ConfigValidationError(f"unknown recipe keyword {key!r}; known: {known}", (key,))
    return cfg


def convergence_cohort(cfg: ConfigContainer) -> ConfigContainer:
    """Megatron-Bridge's 16-GPU convergence values, which its ``qwen3_8b`` and ``qwen3_30b_a3b`` names stand for:
    100 steps of 1024 samples, micro-batch 1, 40 warmup steps from lr 0, decay over the 100 steps, gradients reduced
    in bf16 (``bf16_mixed`` with ``grad_reduce_in_fp32=False``), a checkpoint every 50 steps. In place; returned."""
    from megatron_bridge.config.mixed_precision import bf16_mixed

    cfg.train.train_iters, cfg.train.global_batch_size, cfg.train.micro_batch_size = 100, 1024, 1
    cfg.scheduler.lr_warmup_iters, cfg.scheduler.lr_decay_iters, cfg.scheduler.lr_warmup_init = 40, 100, 0.0
    precision = bf16_mixed()
    precision.grad_reduce_in_fp32 = False
    cfg.mixed_precision, cfg.ddp.grad_reduce_in_fp32 = precision, False
    cfg.checkpoint.save_interval = 50
    return cfg
