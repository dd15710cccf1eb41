"""Qwen3 dense pretraining recipes, 0.6B to 32B (dimensions of the published models)."""

from typing import Any

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.recipes.base import apply_common_overrides, convergence_cohort, pretrain_common


def _qwen3(num_layers: int, hidden: int, ffn: int, heads: int, *, tied: bool, tp: int = 1, pp: int = 1,
           recompute: bool = False, **overrides: Any) -> ConfigContainer:
    """A Qwen3 dense model (head dim 128, 8 KV heads, QK-norm, RoPE base 1e6, vocab 151936, seq 4096,
    positions up to 40960 as the published configs) with
    Megatron-Bridge's Qwen3 training values: its ``_pretrain_common`` (300000 steps of 32 samples, micro-batch 2,
    500 warmup steps, eval every 500 steps over 32 batches, lr 3e-4 → 3e-5), no sequence parallelism, recompute
    only for 32B (full, uniform, 1 layer)."""
    model = ModelConfig(family="qwen3", num_layers=num_layers, hidden_size=hidden, ffn_hidden_size=ffn,
                        num_attention_heads=heads,
                        num_query_groups=8, kv_channels=128, vocab_size=151936, seq_length=4096,
                        max_position_embeddings=40960,
                        rotary_base=1_000_000.0, normalization="RMSNorm", layernorm_epsilon=1e-6,
                        activation="swiglu", qk_layernorm=True, share_embeddings_and_output_weights=tied,
                        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, sequence_parallel=False,
                        pipeline_dtype="bfloat16" if pp > 1 else None)
    if recompute:
        model.recompute_granularity, model.recompute_method, model.recompute_num_layers = "full", "uniform", 1
    cfg = pretrain_common(model)
    cfg.train.train_iters, cfg.train.global_batch_size, cfg.train.micro_batch_size = 300_000, 32, 2
    cfg.scheduler.lr_warmup_iters = 500
    cfg.validation.eval_interval, cfg.validation.eval_iters = 500, 32
    cfg.ddp.data_parallel_sharding_strategy = "optim_grads_params"
    return apply_common_overrides(cfg, **overrides)


def qwen3_600m_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Qwen3 0.6B (28 layers, hidden 1024, FFN 3072, 16 heads, tied embeddings); 1 GPU."""
    return _qwen3(28, 1024, 3072, 16, tied=True, **overrides)


def qwen3_1p7b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Qwen3 1.7B (28 layers, hidden 2048, FFN 6144, 16 heads, tied embeddings); 1 GPU."""
    return _qwen3(28, 2048, 6144, 16, tied=True, **overrides)


def qwen3_4b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Qwen3 4B (36 layers, hidden 2560, FFN 9728, 32 heads, tied embeddings); TP2 (on FSDP2) on 2 GPUs."""
    return _qwen3(36, 2560, 9728, 32, tied=True, tp=2, **overrides)


def qwen3_8b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Qwen3 8B (36 layers, hidden 4096, FFN 12288, 32 heads) as Megatron-Bridge's ``qwen3_8b_pretrain_config``
    (its ``qwen3_8b_pretrain_16gpu_h100_bf16_config``): TP1, data parallel over 16 GPUs, with its convergence
    values (:func:`~megatron_bridge.recipes.base.convergence_cohort`: 100 steps of 1024 samples, 40 warmup steps,
    gradients reduced in bf16). Its 4-GPU variant: ``tensor_model_parallel_size=4, global_batch_size=32,
    micro_batch_size=2``.

    Memory (``run_recipe.py --recipe qwen3_8b --dry-run --nproc 16``): ~79 GiB per H100 with
    ``model.engine=megatron_core`` (Megatron-Bridge's bf16 weights), ~152 GiB on the native engine (fp32 weights and
    gradients under DDP); ~55 GiB on the native engine with ``dist.use_torch_fsdp2=true``."""
    cfg = convergence_cohort(_qwen3(36, 4096, 12288, 32, tied=False, tp=1))
    return apply_common_overrides(cfg, **overrides)


def qwen3_8b_pretrain_4gpu_h100_bf16_config(**overrides: Any) -> ConfigContainer:
    """Qwen3 8B on 4 GPUs (Megatron-Bridge's ``qwen3_8b_pretrain_4gpu_h100_bf16_config``, which its 16-GPU recipe
    starts from): TP4 (on FSDP2) with its ``_pretrain_common`` training values (300000 steps of 32 samples,
    micro-batch 2, 500 warmup steps)."""
    return _qwen3(36, 4096, 12288, 32, tied=False, tp=4, **overrides)


def qwen3_14b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Qwen3 14B (40 layers, hidden 5120, FFN 17408, 40 heads); TP8 (on FSDP2) on 8 GPUs."""
    return _qwen3(40, 5120, 17408, 40, tied=False, tp=8, **overrides)


def qwen3_32b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Qwen3 32B (64 layers, hidden 5120, FFN 25600, 64 heads); TP8 PP2 on 16 GPUs, full recompute (uniform, 1)."""
    return _qwen3(64, 5120, 25600, 64, tied=False, tp=8, pp=2, recompute=True, **overrides)


__all__ = [
    "qwen3_1p7b_pretrain_config",
    "qwen3_4b_pretrain_config",
    "qwen3_8b_pretrain_config",
    "qwen3_8b_pretrain_4gpu_h100_bf16_config",
    "qwen3_14b_pretrain_config",
    "qwen3_32b_pretrain_config",
    "qwen3_600m_pretrain_config",
]
