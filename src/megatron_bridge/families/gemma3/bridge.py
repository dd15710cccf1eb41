"""Gemma 3's Hugging Face mapping (``Gemma3TextConfig``, text only).

* ``layer_types`` (``sliding_attention``/``full_attention`` per layer; legacy ``sliding_window_pattern`` N: every
  N-th layer full) is ``model.window_attn_skip_freq`` as a 0/1 list, ``sliding_window = W`` is
  ``model.window_size = (W - 1, 0)``.
* RoPE per layer type: ``rope_parameters["full_attention"]`` (default, or ``linear`` with ``factor``: Gemma 3 4B and
  up) is ``model.rotary_base`` (and ``model.seq_len_interpolation_factor``), ``rope_parameters["sliding_attention"]``
  is ``model.rotary_base_local``; the legacy format is ``rope_theta``, ``rope_local_base_freq`` and ``rope_scaling``.
* ``query_pre_attn_scalar`` q is ``model.softmax_scale = q ** -0.5``.
* The norms: HF's ``post_attention_layernorm`` is our ``post_self_attn_layernorm`` (on the attention's output), HF's
  ``pre_feedforward_layernorm`` our ``post_attention_layernorm`` (the shared decoder's norm before the MLP), HF's
  ``post_feedforward_layernorm`` our ``post_mlp_layernorm``.
"""

import math
from typing import Any

from megatron_bridge.bridge.families.base import ModelFamily
from megatron_bridge.bridge.rope import DEFAULT_THETA, RopeFormat
from megatron_bridge.config import decoder_names as n
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError


SLIDING, FULL = "sliding_attention", "full_attention"
ROPE_KEYS = ("rope_parameters", "rope_scaling", "rope_theta", "rope_local_base_freq")
HF_NORMS = {n.ATTENTION_OUTPUT_NORM: "post_attention_layernorm", n.MLP_NORM: "pre_feedforward_layernorm",
            n.MLP_OUTPUT_NORM: "post_feedforward_layernorm"}
"""Our norm's name → Hugging Face Gemma's (the others are the same on both sides)."""
LOCAL_THETA = 10000.0
"""transformers' default base of the sliding layers' RoPE."""


class Gemma3Family(ModelFamily):
    """Names and defaults of transformers' ``Gemma3TextConfig``."""

    qk_layernorm = True
    hf_defaults = {"max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "head_dim": 256,
                   "num_key_value_heads": 4, "tie_word_embeddings": True, "sliding_window": 4096,
                   "query_pre_attn_scalar": 256, "attention_bias": False}
    fixed_hf_values = {**{k: v for k, v in ModelFamily.fixed_hf_values.items() if k != "hidden_act"},
                       "hidden_activation": ("gelu_pytorch_tanh",), "attn_logit_softcapping": (None,),
                       "final_logit_softcapping": (None,), "use_bidirectional_attention": (False, None),
                       "attention_bias": (False,)}
    ignored_hf_keys = frozenset({"cache_implementation", "rope_local_base_freq"})
    mapped_hf_keys = (ModelFamily.mapped_hf_keys - {"mlp_bias"}) | {"sliding_window", "layer_types",
                                                                    "sliding_window_pattern", "query_pre_attn_scalar"}

    # --------------------------------------------------------------------------------------------- config in
    def config_from_hf(self, hf: dict[str, Any]) -> ModelConfig:
        """The shared fields, then Gemma's: norms, GeGLU, scaled embedding, window pattern, two RoPEs, scale."""
        self.check_hf_config(hf)
        config = super().config_from_hf({k: v for k, v in hf.items() if k not in ROPE_KEYS})
        self.gemma_fields_from_hf(config, hf)
        config.rotary_base, config.seq_len_interpolation_factor, config.rotary_base_local = _rope_from_hf(hf)
        return config

    def gemma_fields_from_hf(self, config: ModelConfig, hf: dict[str, Any], default_pattern: int = 6) -> None:
        """What Gemma 2 and 3 share: zero-centred norms with post-norms, GeGLU, the scaled embedding, the window
        (``layer_types``, else every ``default_pattern``-th layer full) and the ``query_pre_attn_scalar`` scale."""
        window = self.hf_value(hf, "sliding_window")
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise BridgeError(f"config.json sliding_window={window!r} must be a positive number of tokens")
        scalar = self.hf_value(hf, "query_pre_attn_scalar")
        if not isinstance(scalar, (int, float)) or isinstance(scalar, bool) or scalar <= 0:
            raise BridgeError(f"config.json query_pre_attn_scalar={scalar!r} must be a positive number")
        config.activation = "geglu"
        config.layernorm_zero_centered_gamma = config.post_norms = config.scale_embeddings_by_sqrt_hidden = True
        config.softmax_scale = float(scalar) ** -0.5
        config.window_size = (window - 1, 0)
        types = layer_types(hf, config.num_layers, default_pattern)
        config.window_attn_skip_freq = [int(t == SLIDING) for t in types]

    # -------------------------------------------------------------------------------------------- config out
    def matches(self, config: ModelConfig) -> bool:
        """Gemma's layer: RMSNorm (zero-centred) with post-norms, GeGLU, q/k norm, scaled embedding, a window, no
        biases, no experts, plain RoPE."""
        return (config.normalization == "RMSNorm" and config.activation == "geglu" and config.qk_layernorm
                and not config.is_moe and config.layernorm_zero_centered_gamma and config.post_norms
                and config.scale_embeddings_by_sqrt_hidden and config.window_size is not None
                and not (config.add_qkv_bias or config.add_bias_linear or config.has_attention_output_bias)
                and not config.rope_scaling and config.position_embedding_type == "rope"
                and config.attn_logit_softcapping is None and config.final_logit_softcapping is None)

    def config_to_hf(self, config: ModelConfig, *, rope_format: RopeFormat = "rope_parameters",
                     dtype: str = "float32") -> dict[str, Any]:
        """The shared keys (without ``hidden_act``, Llama's RoPE keys), then Gemma's."""
        if not self.matches(config):
            raise BridgeError(f"the model (activation={config.activation!r}, post_norms={config.post_norms}, "
                              f"layernorm_zero_centered_gamma={config.layernorm_zero_centered_gamma}, window_size="
                              f"{config.window_size}) is not a gemma3 model")
        out = {k: v for k, v in super().config_to_hf(config, rope_format=rope_format, dtype=dtype).items()
               if k not in ROPE_KEYS and k != "hidden_act"}
        return {**out, **_rope_to_hf(config, rope_format)}

    def extra_hf_config(self, config: ModelConfig) -> dict[str, Any]:
        """Window, layer types, ``query_pre_attn_scalar``, GeGLU, soft-capping (None in Gemma 3)."""
        types = [SLIDING if config.attention_window(i) is not None else FULL for i in range(config.num_layers)]
        return {"hidden_activation": "gelu_pytorch_tanh", "sliding_window": config.window_size[0] + 1,
                "layer_types": types, "query_pre_attn_scalar": _query_pre_attn_scalar(config),
                "attn_logit_softcapping": config.attn_logit_softcapping,
                "final_logit_softcapping": config.final_logit_softcapping,
                "use_bidirectional_attention": False}

    # --------------------------------------------------------------------------------------------- weights
    def layer_weight_names(self, config: ModelConfig) -> list[str]:
        """The shared layer's parameters and the two post-norms."""
        return [*n.dense_layer_parameters(config), *(f"{norm}.weight" for norm in n.POST_NORMS)]

    def weight_names(self, config: ModelConfig) -> dict[str, str]:
        """The shared names, with Gemma's names of the norms (:data:`HF_NORMS`)."""
        out = {}
        for ours, hf in super().weight_names(config).items():
            parts = hf.split(".")
            if len(parts) == 5 and parts[3] in HF_NORMS:  # model.layers.<i>.<norm>.weight
                parts[3] = HF_NORMS[parts[3]]
            out[ours] = ".".join(parts)
        return out


def layer_types(hf: dict[str, Any], num_layers: int, default_pattern: int = 6) -> list[str]:
    """``layer_types``, or from the legacy ``sliding_window_pattern`` N (every N-th layer full; ``default_pattern``
    without one: 6 in Gemma 3, 2 in Gemma 2)."""
    types = hf.get("layer_types")
    if types is None:
        pattern = hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or default_pattern
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    if len(types) != num_layers or any(t not in (SLIDING, FULL) for t in types):
        raise BridgeError(f"config.json layer_types={types!r} must give {num_layers} entries, each {SLIDING!r} or "
                          f"{FULL!r}")
    return list(types)


def _rope_from_hf(hf: dict[str, Any]) -> tuple[float, float | None, float]:
    """(global base, linear factor or None, local base) from ``rope_parameters`` per layer type, or the legacy
    ``rope_theta``/``rope_local_base_freq``/``rope_scaling``."""
    params = hf.get("rope_parameters")
    if params is not None:
        if not isinstance(params, dict) or set(params) - {SLIDING, FULL}:
            raise BridgeError(f"config.json rope_parameters must be given per layer type ({FULL!r}, {SLIDING!r}); "
                              f"got {params!r}")
        full, local = params.get(FULL) or {}, params.get(SLIDING) or {}
    else:
        full = {**(hf.get("rope_scaling") or {}), "rope_theta": hf.get("rope_theta", 1_000_000.0)}
        local = {"rope_type": "default", "rope_theta": hf.get("rope_local_base_freq", LOCAL_THETA)}
    if local.get("rope_type", local.get("type", "default")) != "default" or set(local) - {"rope_type", "rope_theta"}:
        raise BridgeError(f"config.json: the sliding layers' RoPE {local!r} must be plain (rope_type 'default')")
    kind = full.get("rope_type", full.get("type", "default"))
    extra = set(full) - {"rope_type", "type", "rope_theta", "factor"}
    if kind not in ("default", "linear") or extra or (kind == "default" and "factor" in full):
        raise BridgeError(f"config.json: the full layers' RoPE {full!r} is not supported; supported: rope_type "
                          "'default', or 'linear' with a factor")
    factor = float(full["factor"]) if kind == "linear" else None
    return float(full.get("rope_theta", DEFAULT_THETA)), factor, float(local.get("rope_theta", LOCAL_THETA))


def _rope_to_hf(config: ModelConfig, fmt: RopeFormat) -> dict[str, Any]:
    """The RoPE keys of ``config`` in format ``fmt`` (per layer type, or the legacy keys)."""
    factor = config.seq_len_interpolation_factor
    local = config.rotary_base_local if config.rotary_base_local is not None else config.rotary_base
    if fmt == "rope_scaling":
        scaling = None if factor is None else {"rope_type": "linear", "factor": factor}
        return {"rope_theta": config.rotary_base, "rope_local_base_freq": local, "rope_scaling": scaling}
    full: dict[str, Any] = {"rope_type": "default"} if factor is None else {"rope_type": "linear", "factor": factor}
    return {"rope_parameters": {FULL: {**full, "rope_theta": config.rotary_base},
                                SLIDING: {"rope_type": "default", "rope_theta": local}}}


def _query_pre_attn_scalar(config: ModelConfig) -> float | int:
    """``softmax_scale ** -2`` (an int when it is one, as Gemma's configs write it); the head width without one."""
    if config.softmax_scale is None:
        return config.head_dim
    scalar = 1.0 / config.softmax_scale**2
    rounded = round(scalar)
    return rounded if math.isclose(scalar, rounded, rel_tol=0.0, abs_tol=1e-9) else scalar
