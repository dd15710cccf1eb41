"""Llama 3 / 3.1 / 3.2 pretraining recipes (dimensions of the published models; no Hugging Face Hub access), under
Megatron-Bridge's names (its ``recipes/llama/llama3.py`` aliases of the H100 recipes)."""

from typing import Any

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.recipes.base import apply_common_overrides, pretrain_common


def _llama3(num_layers: int, hidden: int, ffn: int, heads: int, **extra: Any) -> ModelConfig:
    """A Llama 3-family model: GQA with 8 KV heads, RoPE base 500000, vocab 128256, SwiGLU, RMSNorm."""
    return ModelConfig(family="llama", num_layers=num_layers, hidden_size=hidden, ffn_hidden_size=ffn,
                       num_attention_heads=heads,
                       num_query_groups=8, vocab_size=128256, seq_length=8192, rotary_base=500_000.0,
                       normalization="RMSNorm", activation="swiglu", layernorm_epsilon=1e-5,
                       init_method_std=0.02, **extra)


_LLAMA31_ROPE = {"rope_scaling": True, "rope_scaling_factor": 8.0, "max_position_embeddings": 131072}
_LLAMA32_ROPE = {"rope_scaling": True, "rope_scaling_factor": 32.0, "max_position_embeddings": 131072}
SEQUENCE_LENGTH_16K = 16384
SEQUENCE_LENGTH_64K = 65536
SEQUENCE_LENGTH_128K = 131072
"""Sequence lengths of Megatron-Bridge's long-context Llama 3 8B and Llama 3.1 70B/405B pretrain recipes."""


def llama3_8b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Llama 3 8B (32 layers, hidden 4096, FFN 14336, 32 heads, 8 KV groups, seq 8192); TP1 PP1 CP2 on 2 GPUs, as
    Megatron-Bridge's 2-GPU H100 recipe (``context_parallel_size=1`` for plain data parallelism)."""
    cfg = pretrain_common(_llama3(32, 4096, 14336, 32, context_parallel_size=2))
    return apply_common_overrides(cfg, **overrides)


def _llama3_8b_long_context(seq_length: int, cp: int, overrides: dict[str, Any]) -> ConfigContainer:
    model = _llama3(32, 4096, 14336, 32, tensor_model_parallel_size=4, pipeline_model_parallel_size=2,
                    context_parallel_size=cp, sequence_parallel=True)
    model.seq_length = seq_length
    return apply_common_overrides(pretrain_common(model), **overrides)


def llama3_8b_16k_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Llama 3 8B at 16k tokens per sequence: TP4 PP2 CP2 with sequence parallel, 16 GPUs (Megatron-Bridge's
    ``llama3_8b_pretrain_16gpu_h100_bf16_16k_config``)."""
    return _llama3_8b_long_context(SEQUENCE_LENGTH_16K, 2, overrides)


def llama3_8b_64k_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Llama 3 8B at 64k tokens per sequence: TP4 PP2 CP4 with sequence parallel, 32 GPUs (Megatron-Bridge's
    ``llama3_8b_pretrain_32gpu_h100_bf16_64k_config``)."""
    return _llama3_8b_long_context(SEQUENCE_LENGTH_64K, 4, overrides)


def llama3_8b_128k_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Llama 3 8B at 128k tokens per sequence: TP4 PP2 CP8 with sequence parallel, 64 GPUs (Megatron-Bridge's
    ``llama3_8b_pretrain_64gpu_h100_bf16_128k_config``)."""
    return _llama3_8b_long_context(SEQUENCE_LENGTH_128K, 8, overrides)


LOW_PRECISION_PRESETS = ("bf16_with_fp8_current_scaling_mixed", "bf16_with_mxfp8_mixed", "bf16_with_nvfp4_mixed")
"""The presets of Megatron-Bridge's low-precision Llama 3 8B recipes (FP8 current scaling, MXFP8, NVFP4)."""


def llama3_8b_low_precision(preset: str, overrides: dict[str, Any]) -> ConfigContainer:
    """Megatron-Bridge's ``_llama3_8b_pretrain_2gpu_h100_low_precision``: the 2-GPU Llama 3 8B layout (TP1 PP1 CP2)
    with global batch 768, lr 6e-4 → 6e-6 and the ``preset`` (one of :data:`LOW_PRECISION_PRESETS`); NVFP4 keeps
    the last 4 transformer layers in bf16 (``first_last_layers_bf16``, 0 at the start, 4 at the end)."""
    from megatron_bridge.config.mixed_precision import get_mixed_precision_preset

    if preset not in LOW_PRECISION_PRESETS:
        raise ValueError(f"low-precision preset {preset!r} is not one of {list(LOW_PRECISION_PRESETS)}")
    cfg = pretrain_common(_llama3(32, 4096, 14336, 32, context_parallel_size=2))
    cfg.train.global_batch_size = 768
    cfg.optimizer.lr, cfg.optimizer.min_lr = 6e-4, 6e-6
    if preset == "bf16_with_nvfp4_mixed":
        precision = get_mixed_precision_preset(preset)
        precision.first_last_layers_bf16 = True
        precision.num_layers_at_start_in_bf16, precision.num_layers_at_end_in_bf16 = 0, 4
        cfg.mixed_precision = precision
    else:
        cfg.mixed_precision = preset
    return apply_common_overrides(cfg, **overrides)


def llama3_8b_low_precision_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Llama 3 8B in FP8 with current (per-tensor) scaling, 2 GPUs: Megatron-Bridge's
    ``llama3_8b_low_precision_pretrain_config`` (= ``llama3_8b_pretrain_2gpu_h100_fp8cs_config``): preset
    ``bf16_with_fp8_current_scaling_mixed`` (first and last layer in bf16), global batch 768, lr 6e-4 → 6e-6.
    Needs an FP8 GPU (compute capability >= 8.9) and the engine's FP8 library (rule ``fp8_requirements``)."""
    return llama3_8b_low_precision("bf16_with_fp8_current_scaling_mixed", overrides)


def llama3_70b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Llama 3 70B (80 layers, hidden 8192, FFN 28672, 64 heads); TP4 PP4 VP5 CP2 with sequence parallel, 32 GPUs.

    Interleaved 1F1B over 20 stages of 4 layers; bf16 activations between stages (``pipeline_dtype``)."""
    model = _llama3(80, 8192, 28672, 64, tensor_model_parallel_size=4, pipeline_model_parallel_size=4,
                    virtual_pipeline_model_parallel_size=5, context_parallel_size=2, sequence_parallel=True,
                    pipeline_dtype="bfloat16")
    return apply_common_overrides(pretrain_common(model), **overrides)


def deterministic(cfg: ConfigContainer) -> ConfigContainer:
    """Megatron-Bridge's ``apply_determinism_overrides``: ``model.deterministic_mode=True`` (in place; returned).
    Its other changes have no counterpart here: no fused cross-entropy and no TP communication overlap to turn off;
    its environment (``CUBLAS_WORKSPACE_CONFIG``, ``NCCL_ALGO``, ``NVTE_ALLOW_NONDETERMINISTIC_ALGO``) is set by
    training (:mod:`megatron_bridge.training.determinism`)."""
    cfg.model.deterministic_mode = True
    return cfg


def llama3_70b_pretrain_deterministic_config(**overrides: Any) -> ConfigContainer:
    """:func:`llama3_70b_pretrain_config` with deterministic kernels and reductions (Megatron-Bridge's
    ``llama3_70b_pretrain_deterministic_config``), 32 GPUs."""
    return apply_common_overrides(deterministic(llama3_70b_pretrain_config()), **overrides)


def _llama3_70b_long_context(seq_length: int, pp: int, cp: int, overrides: dict[str, Any]) -> ConfigContainer:
    model = _llama3(80, 8192, 28672, 64, tensor_model_parallel_size=8, pipeline_model_parallel_size=pp,
                    context_parallel_size=cp, sequence_parallel=True, pipeline_dtype="bfloat16")
    model.seq_length = seq_length
    return apply_common_overrides(pretrain_common(model), **overrides)


def llama3_70b_16k_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Llama 3 70B at 16k tokens per sequence: TP8 PP2 CP2 with sequence parallel, 32 GPUs (Megatron-Bridge's
    ``llama3_70b_pretrain_32gpu_h100_bf16_16k_config``)."""
    return _llama3_70b_long_context(SEQUENCE_LENGTH_16K, 2, 2, overrides)


def llama3_70b_64k_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Llama 3 70B at 64k tokens per sequence: TP8 PP4 CP8 with sequence parallel, 256 GPUs (Megatron-Bridge's
    ``llama3_70b_pretrain_256gpu_h100_bf16_64k_config``)."""
    return _llama3_70b_long_context(SEQUENCE_LENGTH_64K, 4, 8, overrides)


def llama31_8b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Llama 3.1 8B: Llama 3 8B with Llama 3.1 RoPE scaling (factor 8); TP1 PP1 CP2 on 2 GPUs."""
    cfg = pretrain_common(_llama3(32, 4096, 14336, 32, context_parallel_size=2, **_LLAMA31_ROPE))
    return apply_common_overrides(cfg, **overrides)


def llama31_70b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Llama 3.1 70B: Llama 3 70B with RoPE scaling (factor 8) at 128k tokens per sequence; TP4 PP4 VP5 CP2 SP,
    32 GPUs (Megatron-Bridge's ``llama31_70b_pretrain_32gpu_h100_bf16_config``)."""
    model = _llama3(80, 8192, 28672, 64, tensor_model_parallel_size=4, pipeline_model_parallel_size=4,
                    virtual_pipeline_model_parallel_size=5, context_parallel_size=2, sequence_parallel=True,
                    pipeline_dtype="bfloat16", **_LLAMA31_ROPE)
    model.seq_length = SEQUENCE_LENGTH_128K
    return apply_common_overrides(pretrain_common(model), **overrides)


def llama31_405b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Llama 3.1 405B (126 layers, hidden 16384, FFN 53248, 128 heads) at 128k tokens per sequence; TP8 PP8 VP2 CP4
    SP, 256 GPUs (DP 1): Megatron-Bridge's ``llama31_405b_pretrain_256gpu_h100_bf16_config``.

    Its pipeline layout: the embedding and the loss count as layers in the split
    (``account_for_embedding/loss_in_pipeline_split``), so 126 + 2 = 128 split into 16 stages of 8, and the first
    and last stages hold 7 decoder layers.
    """
    model = _llama3(126, 16384, 53248, 128, tensor_model_parallel_size=8, pipeline_model_parallel_size=8,
                    virtual_pipeline_model_parallel_size=2, context_parallel_size=4, sequence_parallel=True,
                    account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True,
                    pipeline_dtype="bfloat16", **_LLAMA31_ROPE)
    model.seq_length = SEQUENCE_LENGTH_128K
    return apply_common_overrides(pretrain_common(model), **overrides)


def llama31_405b_pretrain_deterministic_config(**overrides: Any) -> ConfigContainer:
    """:func:`llama31_405b_pretrain_config` with deterministic kernels and reductions (Megatron-Bridge's
    ``llama31_405b_pretrain_deterministic_config``), 256 GPUs."""
    return apply_common_overrides(deterministic(llama31_405b_pretrain_config()), **overrides)


def llama32_1b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Llama 3.2 1B (16 layers, hidden 2048, FFN 8192, 32 heads, tied embeddings, RoPE scaling 32); 1 GPU."""
    model = _llama3(16, 2048, 8192, 32, share_embeddings_and_output_weights=True, **_LLAMA32_ROPE)
    return apply_common_overrides(pretrain_common(model), **overrides)


def llama32_3b_pretrain_config(**overrides: Any) -> ConfigContainer:
    """Llama 3.2 3B (28 layers, hidden 3072, FFN 8192, 24 heads, tied embeddings, RoPE scaling 32); 1 GPU."""
    model = _llama3(28, 3072, 8192, 24, share_embeddings_and_output_weights=True, **_LLAMA32_ROPE)
    return apply_common_overrides(pretrain_common(model), **overrides)
