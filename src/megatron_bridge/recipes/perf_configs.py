"""Per-GPU performance configs: Megatron-Bridge's flat perf recipes (``perf_recipes/<family>/<gpu>/...``) as data.

``scripts/performance/launch.py -g <gpu>`` applies the config registered for (recipe, GPU, compute dtype) on top of
the recipe; without ``-g`` (or without a registered config) the recipe itself is benchmarked. Each entry states the
number of GPUs it was tuned for: a different ``-ng`` weak-scales the global batch with the data-parallel size, as
Megatron-Bridge's launcher does (unless ``-gb`` is given).
"""

from dataclasses import dataclass, field

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.mixed_precision import MixedPrecisionConfig, get_mixed_precision_preset
from megatron_bridge.errors import ConfigValidationError


COMMON_PERF_ENV_VARS: dict[str, str] = {"TORCH_NCCL_HIGH_PRIORITY": "1"}
"""Megatron-Bridge's ``COMMON_PERF_ENV_VARS`` (perf_recipes/environment.py): set in every flat perf recipe."""


@dataclass(frozen=True)
class PerfConfig:
    """One flat perf recipe: layout, batch, precision details and the process environment it is measured with."""

    num_gpus: int
    """GPUs the values are tuned for (the ``<N>gpu`` of Megatron-Bridge's recipe name)."""
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    sequence_parallel: bool = False
    global_batch_size: int = 128
    micro_batch_size: int = 1
    grad_reduce_in_fp32: bool = False
    """Megatron-Bridge's ``_perf_precision`` always reduces gradients in the compute dtype."""
    env_vars: dict[str, str] = field(default_factory=dict)
    """Environment of the measured run (applied with ``os.environ.setdefault`` by the launcher)."""
    source: str = ""
    """The Megatron-Bridge function these values come from."""

    def apply(self, cfg: ConfigContainer, compute_dtype: str) -> ConfigContainer:
        """Set the layout, batch sizes and precision on ``cfg`` (in place; returned for chaining)."""
        m = cfg.model
        m.tensor_model_parallel_size = self.tensor_model_parallel_size
        m.pipeline_model_parallel_size = self.pipeline_model_parallel_size
        m.context_parallel_size = self.context_parallel_size
        m.virtual_pipeline_model_parallel_size = self.virtual_pipeline_model_parallel_size
        m.sequence_parallel = self.sequence_parallel
        cfg.dist.use_torch_fsdp2 = self.tensor_model_parallel_size > 1  # TP runs on FSDP2 here
        cfg.train.global_batch_size = self.global_batch_size
        cfg.train.micro_batch_size = self.micro_batch_size
        precision = precision_config(compute_dtype)
        precision.grad_reduce_in_fp32 = self.grad_reduce_in_fp32
        cfg.mixed_precision = precision
        return cfg


COMPUTE_DTYPE_PRESETS: dict[str, str] = {
    "bf16": "bf16_mixed", "fp16": "fp16_mixed", "fp32": "fp32",
    "fp8_cs": "bf16_with_fp8_current_scaling_mixed", "fp8_mx": "bf16_with_mxfp8_mixed",
    "fp8_sc": "bf16_with_fp8_subchannel_scaling_mixed", "nvfp4": "bf16_with_nvfp4_mixed",
}
"""``-c/--compute_dtype`` → the mixed-precision preset it selects (Megatron-Bridge's
``scripts/performance/utils/precision.py::get_precision_config``; fp16 and fp32 are ours, for CPU runs)."""
PERF_PRESET_CHANGES: dict[str, dict[str, object]] = {"fp8_cs": {"first_last_layers_bf16": False}}
"""Fields the launcher changes on the preset: ``fp8_cs`` runs every layer in FP8 ("Disable BF16 Transformer layers in
the performance config", as Megatron-Bridge's ``get_precision_config`` does)."""


def precision_config(compute_dtype: str) -> MixedPrecisionConfig:
    """The mixed-precision config ``-c compute_dtype`` selects (an unknown value is a named error)."""
    if compute_dtype not in COMPUTE_DTYPE_PRESETS:
        raise ConfigValidationError(f"--compute_dtype {compute_dtype!r} is not one of "
                                    f"{sorted(COMPUTE_DTYPE_PRESETS)}", ("mixed_precision",))
    precision = get_mixed_precision_preset(COMPUTE_DTYPE_PRESETS[compute_dtype])
    for name, value in PERF_PRESET_CHANGES.get(compute_dtype, {}).items():
        setattr(precision, name, value)
    return precision


PERF_CONFIGS: dict[tuple[str, str, str], PerfConfig] = {
    ("llama3_8b", "h100", "bf16"): PerfConfig(
        num_gpus=8, tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=2,
        virtual_pipeline_model_parallel_size=None, sequence_parallel=False, global_batch_size=128,
        micro_batch_size=1, grad_reduce_in_fp32=False,
        env_vars={**COMMON_PERF_ENV_VARS, "CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_GRAPH_REGISTER": "0",
                  "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
                  "NCCL_NVLS_ENABLE": "0", "NVTE_BWD_LAYERNORM_SM_MARGIN": "20",
                  "NVTE_FWD_LAYERNORM_SM_MARGIN": "20"},
        source="megatron.bridge.perf_recipes.llama.h100.llama3.llama3_8b_pretrain_8gpu_h100_bf16_config",
    ),
}
"""(recipe, GPU, compute dtype) → perf config. Add an entry per measured Megatron-Bridge flat recipe."""


def get_perf_config(recipe: str, gpu: str, compute_dtype: str) -> PerfConfig | None:
    """The registered perf config, or None (the launcher then benchmarks the recipe itself)."""
    return PERF_CONFIGS.get((recipe, gpu.lower(), compute_dtype))
