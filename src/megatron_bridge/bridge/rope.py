"""RoPE settings between Hugging Face configs and :class:`ModelConfig`, in both transformers formats.

* ``rope_parameters`` (transformers ≥ 5): ``{"rope_type", "rope_theta", ...scaling keys}``.
* ``rope_scaling`` + top-level ``rope_theta`` (transformers 4.x; ``rope_scaling`` is null without scaling; old
  files say ``"type"`` instead of ``"rope_type"``).

Supported rope types: ``default``, ``llama3`` (Llama 3.1/3.2 frequency scaling) and ``yarn`` (``model.yarn_*``;
an explicit ``attention_factor`` must equal the one the other keys give). Anything else — another rope_type,
per-layer-type RoPE, ``partial_rotary_factor`` < 1 — is a :class:`BridgeError`, never dropped.
"""

from typing import Any, Literal

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError


RopeFormat = Literal["rope_parameters", "rope_scaling"]
ROPE_FORMATS: tuple[str, ...] = ("rope_parameters", "rope_scaling")
DEFAULT_THETA = 10000.0
"""transformers' default RoPE base when a config names none."""
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
_YARN_KEYS: dict[str, tuple[str, Any]] = {
    "factor": ("yarn_rotary_scaling_factor", None),
    "original_max_position_embeddings": ("yarn_original_max_position_embeddings", None),
    "beta_fast": ("yarn_beta_fast", 32.0),
    "beta_slow": ("yarn_beta_slow", 1.0),
    "mscale": ("yarn_mscale", 1.0),
    "mscale_all_dim": ("yarn_mscale_all_dim", 0.0),
    "truncate": ("yarn_correction_range_round_to_int", True),
}
"""HF ``yarn`` key → (ModelConfig field, transformers' default; None: required)."""
_ROPE_KEYS_ALLOWED = {"rope_type", "type", "rope_theta", "partial_rotary_factor", *_LLAMA3_KEYS}


def rope_format_of(hf: dict[str, Any]) -> RopeFormat:
    """Which format a HF config dict uses (``rope_parameters`` when it has that key)."""
    return "rope_parameters" if hf.get("rope_parameters") is not None else "rope_scaling"


def rope_fields_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
    """The ModelConfig RoPE fields (``rotary_base``, ``rope_scaling`` and its factors) of a HF config dict."""
    params = hf.get("rope_parameters")
    if params is None:
        params = hf.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise BridgeError(f"config.json rope settings must be an object; got {params!r}")
    if params and all(isinstance(v, dict) or v is None for v in params.values()):
        raise BridgeError(f"config.json has per-layer-type RoPE settings ({sorted(params)}); only one RoPE for all "
                          "layers is supported")
    unknown = sorted(set(params) - _ROPE_KEYS_ALLOWED)
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta", hf.get("rope_theta", DEFAULT_THETA))
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise BridgeError(f"config.json partial_rotary_factor={partial} is not supported (only full-width RoPE)")
    if rope_type == "default":
        if unknown or any(k in params for k in _LLAMA3_KEYS):
            raise BridgeError(f"config.json rope_type 'default' has unsupported keys {unknown or list(_LLAMA3_KEYS)}")
        return {"rotary_base": float(theta), "rope_scaling": False}
    if rope_type == "llama3":
        missing = [k for k in _LLAMA3_KEYS if params.get(k) is None]
        if missing or unknown:
            raise BridgeError(f"config.json rope_type 'llama3' needs {list(_LLAMA3_KEYS)}; missing {missing}, "
                              f"unknown {unknown}")
        return {
            "rotary_base": float(theta),
            "rope_scaling": True,
            "rope_scaling_factor": float(params["factor"]),
            "rope_low_freq_factor": float(params["low_freq_factor"]),
            "rope_high_freq_factor": float(params["high_freq_factor"]),
            "rope_original_max_position_embeddings": int(params["original_max_position_embeddings"]),
        }
    if rope_type == "yarn":
        return {"rotary_base": float(theta), "rope_scaling": False, **_yarn_fields(params)}
    raise BridgeError(f"config.json rope_type={rope_type!r} is not supported; supported: 'default' (plain RoPE), "
                      "'llama3' (Llama 3.1/3.2 scaling) and 'yarn'")


def _yarn_fields(params: dict[str, Any]) -> dict[str, Any]:
    """The ``model.yarn_*`` fields of a ``rope_type: yarn`` dict (transformers' defaults for absent keys)."""
    unknown = sorted(set(params) - _ROPE_KEYS_ALLOWED - set(_YARN_KEYS) - {"attention_factor"})
    missing = [k for k, (_, default) in _YARN_KEYS.items() if default is None and params.get(k) is None]
    if unknown or missing:
        raise BridgeError(f"config.json rope_type 'yarn': missing {missing}, unknown {unknown}")
    fields: dict[str, Any] = {"position_embedding_type": "yarn"}
    for key, (field, default) in _YARN_KEYS.items():
        value = params.get(key)
        fields[field] = default if value is None else value
    fields["yarn_rotary_scaling_factor"] = float(fields["yarn_rotary_scaling_factor"])
    fields["yarn_original_max_position_embeddings"] = int(fields["yarn_original_max_position_embeddings"])
    for name in ("yarn_beta_fast", "yarn_beta_slow", "yarn_mscale", "yarn_mscale_all_dim"):
        fields[name] = float(fields[name])
    given = params.get("attention_factor")
    if given is not None:
        from megatron_bridge.models.layers import rope_attention_factor

        computed = rope_attention_factor(ModelConfig(**fields))
        if abs(float(given) - computed) > 1e-12 * max(1.0, computed):
            raise BridgeError(f"config.json rope_type 'yarn' attention_factor={given} differs from the {computed} its "
                              "factor, mscale and mscale_all_dim give; only the computed one is supported")
    return fields


def _yarn_to_hf(config: ModelConfig) -> dict[str, Any]:
    return {"rope_type": "yarn", **{key: getattr(config, field) for key, (field, _) in _YARN_KEYS.items()}}


def rope_to_hf(config: ModelConfig, fmt: RopeFormat) -> dict[str, Any]:
    """The config.json keys for ``config``'s RoPE in format ``fmt``."""
    if fmt not in ROPE_FORMATS:
        raise BridgeError(f"rope format {fmt!r} is unknown; use one of {ROPE_FORMATS}")
    scaling: dict[str, Any] | None = _yarn_to_hf(config) if config.position_embedding_type == "yarn" else None
    if config.rope_scaling:
        scaling = {
            "rope_type": "llama3",
            "factor": config.rope_scaling_factor,
            "low_freq_factor": config.rope_low_freq_factor,
            "high_freq_factor": config.rope_high_freq_factor,
            "original_max_position_embeddings": config.rope_original_max_position_embeddings,
        }
    if fmt == "rope_scaling":
        return {"rope_theta": config.rotary_base, "rope_scaling": scaling}
    params = {"rope_type": "default"} if scaling is None else dict(scaling)
    return {"rope_parameters": {**params, "rope_theta": config.rotary_base}}
