"""Megatron-Bridge's GB200 Qwen3-MoE pretraining name (``recipes/qwen/gb200/qwen3_moe.py``)."""

from typing import Any

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.mixed_precision import bf16_with_mxfp8_mixed
from megatron_bridge.recipes.base import apply_common_overrides
from megatron_bridge.recipes.qwen.qwen3_moe import qwen3_30b_a3b_pretrain_config


def qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_functional_config(**overrides: Any) -> ConfigContainer:
    """Qwen3-30B-A3B's functional MXFP8 run on 8 GB200s (Megatron-Bridge's name): its 16-GPU convergence recipe
    (100 steps, 40 warmup steps) on TP1 PP1 CP1 EP8, global batch 512 of micro-batch 4, ``bf16_with_mxfp8_mixed``
    with gradients reduced in bf16, no evaluation, a log line every step, no TensorBoard. Its transformer-engine
    and DeepEP kernel switches (hybrid-EP dispatcher, CUDA graphs, op fuser, FP8 attention) have no counterpart here.
    MXFP8 needs a Blackwell GPU (compute capability >= 10.0; rule ``fp8_requirements``)."""
    cfg = qwen3_30b_a3b_pretrain_config()
    m = cfg.model
    m.tensor_model_parallel_size = m.pipeline_model_parallel_size = m.context_parallel_size = 1
    m.virtual_pipeline_model_parallel_size, m.sequence_parallel = None, False
    m.expert_model_parallel_size, m.expert_tensor_parallel_size = 8, 1
    cfg.dist.use_torch_fsdp2 = False
    precision = bf16_with_mxfp8_mixed()
    precision.grad_reduce_in_fp32 = False
    cfg.mixed_precision, cfg.ddp.grad_reduce_in_fp32 = precision, False
    cfg.train.global_batch_size, cfg.train.micro_batch_size = 512, 4
    cfg.validation.eval_interval, cfg.validation.eval_iters = None, 0
    cfg.logger.log_interval, cfg.logger.tensorboard_dir = 1, None
    return apply_common_overrides(cfg, **overrides)


__all__ = ["qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_functional_config"]
