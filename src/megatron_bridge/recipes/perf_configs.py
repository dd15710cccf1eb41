"""Per-GPU performance configs: Megatron-Bridge's flat perf recipes (``perf_recipes/<family>/<gpu>/...``), as the rows
of :mod:`megatron_bridge.recipes.perf_tables`, and how its launcher picks one.

``scripts/performance/launch.py -mr <recipe> -g <gpu> -c <dtype> -ng <N>`` applies the config Megatron-Bridge's
``run_script.py`` would load: ``<recipe>_pretrain_<N>gpu_<gpu>_<dtype>_config`` when it exists; otherwise the default
one for (recipe, GPU, dtype) (:data:`DEFAULT_GPU_COUNT`, else the largest GPU count), whose global batch the launcher
then weak-scales with the data-parallel size (unless ``-gb`` is given). Without ``-g``, or for a (recipe, GPU, dtype)
Megatron-Bridge has no perf recipe for, the recipe itself is benchmarked (Megatron-Bridge refuses that case).
"""

import re
from dataclasses import dataclass, field

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.mixed_precision import MixedPrecisionConfig, get_mixed_precision_preset
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.recipes.perf_tables import ROW_FIELDS, ROWS
from megatron_bridge.recipes.perf_tables.env import COMMON_PERF_ENV_VARS
from megatron_bridge.utils.logging import get_logger, log_rank_0


logger = get_logger(__name__)

__all__ = ["COMMON_PERF_ENV_VARS", "COMPUTE_DTYPE_PRESETS", "DEFAULT_GPU_COUNT", "PERF_CONFIGS", "PerfConfig",
           "get_perf_config", "perf_config_key", "precision_config"]


@dataclass(frozen=True)
class PerfConfig:
    """One flat perf recipe: layout, batch, memory options and the process environment it is measured with."""

    num_gpus: int
    """GPUs the values are tuned for (the ``<N>gpu`` of Megatron-Bridge's recipe name)."""
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None
    sequence_parallel: bool = False
    global_batch_size: int = 128
    micro_batch_size: int = 1
    seq_length: int | None = None
    """Model and dataset sequence length; None keeps the recipe's."""
    recompute: tuple[str, str | None, int | None] | None = None
    """(recompute_granularity, recompute_method, recompute_num_layers); None: no recompute."""
    cpu_offloading_num_layers: int | None = None
    """Offload the activations of this many blocks to CPU memory (weights stay); None: no offloading."""
    use_megatron_fsdp: bool = False
    """Megatron FSDP (:func:`megatron_bridge.recipes.perf.megatron_fsdp_overrides`), the row's layout kept."""
    pipeline_model_parallel_layout: str | None = None
    """Megatron-Bridge's explicit stage layout (``model.pipeline_model_parallel_layout``); set, it replaces the
    recipe's first/last-stage sizes and account-for fields; None keeps the recipe's split."""
    moe_token_dispatcher_type: str | None = None
    """``"flex"`` (DeepEP/HybridEP kernels) there; here MoE tokens travel with all-to-all (logged)."""
    grad_reduce_in_fp32: bool = False
    """Megatron-Bridge's ``_perf_precision`` always reduces gradients in the compute dtype."""
    env_vars: dict[str, int | str] = field(default_factory=dict)
    """Environment of the measured run (applied with ``os.environ.setdefault`` by the launcher)."""
    source: str = ""
    """The Megatron-Bridge function these values come from."""

    def apply(self, cfg: ConfigContainer, compute_dtype: str) -> ConfigContainer:
        """Set the layout, batch sizes, memory options and precision on ``cfg`` (in place; returned)."""
        if self.use_megatron_fsdp:
            from megatron_bridge.recipes.perf import megatron_fsdp_overrides

            megatron_fsdp_overrides(cfg)  # before the layout, which the row sets
        self._apply_layout(cfg)
        self._apply_memory_options(cfg)
        cfg.train.global_batch_size, cfg.train.micro_batch_size = self.global_batch_size, self.micro_batch_size
        if self.seq_length is not None:
            cfg.model.seq_length = cfg.dataset.seq_length = self.seq_length
        precision = precision_config(compute_dtype)
        precision.grad_reduce_in_fp32 = self.grad_reduce_in_fp32
        cfg.mixed_precision = precision
        self._log_what_is_not_expressible()
        return cfg

    def _apply_layout(self, cfg: ConfigContainer) -> None:
        m = cfg.model
        m.tensor_model_parallel_size = self.tensor_model_parallel_size
        m.pipeline_model_parallel_size = self.pipeline_model_parallel_size
        m.context_parallel_size = self.context_parallel_size
        m.virtual_pipeline_model_parallel_size = self.virtual_pipeline_model_parallel_size
        m.sequence_parallel = self.sequence_parallel
        if m.num_moe_experts:
            m.expert_model_parallel_size = self.expert_model_parallel_size
            m.expert_tensor_parallel_size = self.expert_tensor_parallel_size
        if not cfg.dist.use_megatron_fsdp:
            cfg.dist.use_torch_fsdp2 = self.tensor_model_parallel_size > 1  # TP: FSDP2 (recipes/base.py)
        if self.pipeline_model_parallel_layout is not None:
            m.pipeline_model_parallel_layout = self.pipeline_model_parallel_layout
            m.num_layers_in_first_pipeline_stage = m.num_layers_in_last_pipeline_stage = None
            m.account_for_embedding_in_pipeline_split = m.account_for_loss_in_pipeline_split = False

    def _apply_memory_options(self, cfg: ConfigContainer) -> None:
        m = cfg.model
        m.recompute_granularity, m.recompute_method, m.recompute_num_layers = self.recompute or (None, None, None)
        if self.cpu_offloading_num_layers is not None:
            m.cpu_offloading, m.cpu_offloading_weights = True, False
            m.cpu_offloading_num_layers = self.cpu_offloading_num_layers

    def _log_what_is_not_expressible(self) -> None:
        if self.moe_token_dispatcher_type == "flex":
            log_rank_0(logger, "%s: the 'flex' MoE dispatcher (DeepEP/HybridEP) is not built here; tokens travel "
                       "with all-to-all", self.source)


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
RECIPE_NAME_DTYPES: dict[str, str] = {"bf16": "bf16", "fp8cs": "fp8_cs", "fp8mx": "fp8_mx", "nvfp4": "nvfp4"}
"""The dtype of a flat perf recipe's name → the ``-c`` value (Megatron-Bridge's ``_PRECISION_NAME_MAP``, inverted)."""


def precision_config(compute_dtype: str) -> MixedPrecisionConfig:
    """The mixed-precision config ``-c compute_dtype`` selects (an unknown value is a named error)."""
    if compute_dtype not in COMPUTE_DTYPE_PRESETS:
        raise ConfigValidationError(f"--compute_dtype {compute_dtype!r} is not one of "
                                    f"{sorted(COMPUTE_DTYPE_PRESETS)}", ("mixed_precision",))
    precision = get_mixed_precision_preset(COMPUTE_DTYPE_PRESETS[compute_dtype])
    for name, value in PERF_PRESET_CHANGES.get(compute_dtype, {}).items():
        setattr(precision, name, value)
    return precision


_NAME = re.compile(r"^(?P<recipe>\w+?)_pretrain_(?P<gpus>\d+)gpu_(?P<gpu>[a-z0-9]+)_(?P<dtype>[a-z0-9]+)_config$")


def perf_config_key(function_name: str) -> tuple[str, str, str, int]:
    """(recipe, GPU, ``-c`` dtype, GPU count) of a flat perf recipe's function name."""
    match = _NAME.match(function_name)
    if match is None or match["dtype"] not in RECIPE_NAME_DTYPES:
        raise ValueError(f"not a flat pretraining perf recipe name: {function_name!r}")
    return match["recipe"], match["gpu"], RECIPE_NAME_DTYPES[match["dtype"]], int(match["gpus"])


MEGATRON_BRIDGE_PERF_MODULES: dict[str, tuple[str, str]] = {
    "llama3": ("llama", "llama3"), "llama31": ("llama", "llama31"), "qwen3": ("qwen", "qwen3_moe"),
}
"""First word of a perf recipe's name → the folder and module of Megatron-Bridge's ``perf_recipes`` that define it
(recorded as each perf config's ``source``)."""


def _perf_config(name: str, row: tuple) -> PerfConfig:
    *values, extras = row if isinstance(row[-1], dict) and len(row) > len(ROW_FIELDS) else (*row, {})
    folder, module = MEGATRON_BRIDGE_PERF_MODULES[name.split("_")[0]]
    _, gpu, _, gpus = perf_config_key(name)
    return PerfConfig(num_gpus=gpus, **dict(zip(ROW_FIELDS, values, strict=True)), **extras,
                      source=f"megatron.bridge.perf_recipes.{folder}.{gpu}.{module}.{name}")


PERF_CONFIGS: dict[tuple[str, str, str, int], PerfConfig] = {
    perf_config_key(name): _perf_config(name, row) for name, row in ROWS.items()
}
"""(recipe, GPU, compute dtype, GPU count) → perf config, one per Megatron-Bridge flat pretraining perf recipe."""
DEFAULT_GPU_COUNT: dict[tuple[str, str, str], int] = {
    ("llama3_8b", gpu, dtype): 8 for gpu, dtype in (("b200", "bf16"), ("b200", "fp8_cs"), ("gb200", "bf16"),
                                                    ("gb200", "fp8_cs"), ("gb300", "bf16"), ("gb300", "fp8_cs"),
                                                    ("gb300", "fp8_mx"), ("gb300", "nvfp4"), ("h100", "bf16"),
                                                    ("h100", "fp8_cs"))
} | {
    ("qwen3_30b_a3b", gpu, dtype): 8 for gpu in ("b200", "gb200", "gb300") for dtype in ("bf16", "fp8_cs")
} | {("qwen3_30b_a3b", "h100", "bf16"): 16, ("qwen3_30b_a3b", "h100", "fp8_cs"): 16}
"""Megatron-Bridge's ``_DEFAULT_GPU_COUNT_OVERRIDES`` for our families: the config used when ``-ng`` names no GPU
count of its own; every other (recipe, GPU, dtype) defaults to its largest GPU count."""


def get_perf_config(recipe: str, gpu: str, compute_dtype: str, num_gpus: int | None = None) -> PerfConfig | None:
    """The perf config Megatron-Bridge's launcher loads for ``-mr recipe -g gpu -c compute_dtype -ng num_gpus``: the
    one of exactly ``num_gpus`` GPUs, else the default one (:data:`DEFAULT_GPU_COUNT`, else the largest GPU count);
    None when Megatron-Bridge has none for (recipe, GPU, dtype)."""
    gpu = gpu.lower()
    counts = sorted(n for (r, g, d, n) in PERF_CONFIGS if (r, g, d) == (recipe, gpu, compute_dtype))
    if not counts:
        return None
    if num_gpus in counts:
        return PERF_CONFIGS[recipe, gpu, compute_dtype, num_gpus]
    default = DEFAULT_GPU_COUNT.get((recipe, gpu, compute_dtype), counts[-1])
    return PERF_CONFIGS[recipe, gpu, compute_dtype, default]
