"""Checks that a :class:`ModelConfig` can be built by the local engine, with errors that name the field and the fix."""

import importlib.util

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import ConfigValidationError, MissingDependencyError


_ENGINE_MODULES: dict[str, str] = {"transformer_engine": "transformer_engine", "megatron_core": "megatron.core"}
_ENGINE_INSTALL: dict[str, str] = {
    "transformer_engine": "pip install 'megatron-bridge[te]' on a machine with CUDA",
    "megatron_core": "pip install 'megatron-bridge[mcore]' in its own environment (see docs/installation.md)",
}


def is_importable(module_name: str) -> bool:
    """Whether ``module_name`` can be found, without importing it.

    Only the parent packages of a dotted name are imported. Errors while looking it up (a missing parent, or a
    package such as transformer-engine that raises ``RuntimeError`` on a machine without CUDA) count as "no".
    """
    try:
        return importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError, RuntimeError, OSError):
        return False


def check_transformer_impl(config: ModelConfig) -> None:
    """Raise unless ``config.transformer_impl`` is an engine this version can build.

    Raises:
        MissingDependencyError: a GPU engine is asked for but its package is not installed.
        ConfigValidationError: the engine is installed but not wired into this version, or the value is unknown.
    """
    impl = config.transformer_impl
    if impl == "local":
        return
    if impl not in _ENGINE_MODULES:
        raise ConfigValidationError(
            f"model.transformer_impl={impl!r} is not a known engine; use one of 'local', 'transformer_engine', "
            "'megatron_core' (only 'local' is built by this version).",
            ("model.transformer_impl",),
        )
    module = _ENGINE_MODULES[impl]
    if not is_importable(module):
        raise MissingDependencyError(
            f"model.transformer_impl={impl!r} needs the package '{module}', which is not installed. "
            f"Fix: {_ENGINE_INSTALL[impl]}, or set model.transformer_impl='local' "
            "(plain PyTorch, runs on CPU and GPU)."
        )
    raise ConfigValidationError(
        f"model.transformer_impl={impl!r}: '{module}' is installed, but that engine is not wired into this version "
        "of megatron-bridge. Fix: set model.transformer_impl='local'.",
        ("model.transformer_impl",),
    )


def check_parallel_layout(config: ModelConfig) -> None:
    """Raise for model-parallel layouts the local engine cannot build (PP, VPP, CP and EP).

    Tensor parallelism is applied by the distributed layer to the full model built here, so TP is accepted.
    """
    pp, vpp = config.pipeline_model_parallel_size, config.virtual_pipeline_model_parallel_size
    cp, ep = config.context_parallel_size, config.expert_model_parallel_size
    unsupported = [
        ("pipeline_model_parallel_size", pp, pp > 1, 1),
        ("virtual_pipeline_model_parallel_size", vpp, vpp is not None, None),
        ("context_parallel_size", cp, cp > 1, 1),
        ("expert_model_parallel_size", ep, ep > 1, 1),
    ]
    for name, value, bad, fix in unsupported:
        if bad:
            raise ConfigValidationError(
                f"model.{name}={value!r} is not supported by the local engine in this version "
                f"(it builds the whole model on every rank). Fix: set model.{name}={fix!r}; use data parallelism, "
                "FSDP or tensor parallelism instead.",
                (f"model.{name}",),
            )


def _require(ok: bool, path: str, message: str) -> None:
    if not ok:
        raise ConfigValidationError(message, (path,))


def validate_model_config(config: ModelConfig) -> None:
    """Raise :class:`ConfigValidationError` if the architecture fields of ``config`` cannot form a model."""
    for name in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size", "seq_length"):
        value = getattr(config, name)
        _require(
            isinstance(value, int) and value >= 1, f"model.{name}", f"model.{name}={value!r} must be a positive int."
        )
    if config.kv_channels is None:
        _require(
            config.hidden_size % config.num_attention_heads == 0,
            "model.num_attention_heads",
            f"model.hidden_size={config.hidden_size} is not divisible by "
            f"model.num_attention_heads={config.num_attention_heads}. "
            "Fix: change one of them, or set model.kv_channels.",
        )
    head_dim = config.head_dim
    _require(
        head_dim >= 2 and head_dim % 2 == 0,
        "model.kv_channels",
        f"head width {head_dim} (model.kv_channels, or hidden_size // num_attention_heads) must be even and >= 2 "
        "for rotary embeddings. Fix: set model.kv_channels to an even number.",
    )
    kv = config.num_kv_heads
    _require(
        kv >= 1 and config.num_attention_heads % kv == 0,
        "model.num_query_groups",
        f"model.num_query_groups={config.num_query_groups!r} must be >= 1 and divide "
        f"model.num_attention_heads={config.num_attention_heads}. Fix: pick a divisor, or None for plain MHA.",
    )
    _require(
        config.normalization in ("RMSNorm", "LayerNorm"),
        "model.normalization",
        f"model.normalization={config.normalization!r} must be 'RMSNorm' or 'LayerNorm'.",
    )
    _require(
        config.activation in ("swiglu", "gelu"),
        "model.activation",
        f"model.activation={config.activation!r} must be 'swiglu' or 'gelu'.",
    )
    _require(
        config.make_vocab_size_divisible_by >= 1,
        "model.make_vocab_size_divisible_by",
        f"model.make_vocab_size_divisible_by={config.make_vocab_size_divisible_by!r} must be >= 1.",
    )
    _require(
        config.params_dtype in ("float32", "bfloat16", "float16"),
        "model.params_dtype",
        f"model.params_dtype={config.params_dtype!r} must be 'float32', 'bfloat16' or 'float16'.",
    )
    if config.rope_scaling:
        _require(
            config.rope_scaling_factor > 0,
            "model.rope_scaling_factor",
            f"model.rope_scaling_factor={config.rope_scaling_factor!r} must be > 0 (Llama 3.1 uses 8.0).",
        )
        _require(
            config.rope_high_freq_factor > config.rope_low_freq_factor > 0,
            "model.rope_high_freq_factor",
            f"model.rope_high_freq_factor={config.rope_high_freq_factor!r} must be greater than "
            f"model.rope_low_freq_factor={config.rope_low_freq_factor!r} > 0 (Llama 3.1 uses 4.0 and 1.0).",
        )
    if config.cpu_offloading:
        _require(
            not config.cpu_offloading_weights,
            "model.cpu_offloading_weights",
            "model.cpu_offloading_weights=True is not supported by the local engine (only activations are "
            "offloaded). Fix: set model.cpu_offloading_weights=False.",
        )
        n = config.cpu_offloading_num_layers
        _require(
            isinstance(n, int) and 0 <= n < config.num_layers,
            "model.cpu_offloading_num_layers",
            f"model.cpu_offloading_num_layers={n!r} must satisfy 0 <= n < model.num_layers={config.num_layers}.",
        )
