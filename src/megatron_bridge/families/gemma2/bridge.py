"""Gemma 2's Hugging Face mapping (transformers' ``Gemma2Config``), Gemma 3's (``families/gemma3/bridge.py``) but:

* no q/k norm; one RoPE (``rope_parameters``/``rope_theta`` as every family reads it, default base 10000);
* ``attn_logit_softcapping`` and ``final_logit_softcapping`` are ``model.attn_logit_softcapping`` and
  ``model.final_logit_softcapping`` (an explicit null: no capping; absent: transformers' defaults 50 and 30);
* ``layer_types`` absent (configs written before transformers had it): the even layers windowed, the odd ones full;
* older configs carry ``hidden_act`` next to ``hidden_activation`` (both ``gelu_pytorch_tanh``) and
  ``cache_implementation`` (ignored).

Weights: as Gemma 3's (HF ``post_attention_layernorm`` is our ``post_self_attn_layernorm``,
``pre_feedforward_layernorm`` our ``post_attention_layernorm``, ``post_feedforward_layernorm`` our
``post_mlp_layernorm``), without q/k norms.
"""

from typing import Any

from megatron_bridge.bridge.families.base import ModelFamily
from megatron_bridge.bridge.rope import RopeFormat
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError
from megatron_bridge.families.gemma3.bridge import Gemma3Family


SOFTCAPS = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}
"""HF key (our field of the same name) → transformers' default when the key is absent."""


class Gemma2Family(Gemma3Family):
    """Names and defaults of transformers' ``Gemma2Config``."""

    qk_layernorm = False
    soft_capping = True
    hf_defaults = {**Gemma3Family.hf_defaults, "max_position_embeddings": 8192, "num_key_value_heads": 4}
    fixed_hf_values = {**{k: v for k, v in Gemma3Family.fixed_hf_values.items() if k not in SOFTCAPS},
                       "hidden_act": ("gelu_pytorch_tanh", None), "use_bidirectional_attention": (False, None)}
    ignored_hf_keys = frozenset({"cache_implementation"})
    mapped_hf_keys = Gemma3Family.mapped_hf_keys | set(SOFTCAPS)

    # --------------------------------------------------------------------------------------------- config in
    def config_from_hf(self, hf: dict[str, Any]) -> ModelConfig:
        """The shared fields and RoPE, Gemma's layer (:meth:`Gemma3Family.gemma_fields_from_hf`, every other layer
        windowed by default), then the soft-capping."""
        self.check_hf_config(hf)
        config = ModelFamily.config_from_hf(self, hf)
        self.gemma_fields_from_hf(config, hf, default_pattern=2)
        for key, default in SOFTCAPS.items():
            cap = hf.get(key, default)
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap <= 0):
                raise BridgeError(f"config.json {key}={cap!r} must be a positive number or null")
            setattr(config, key, None if cap is None else float(cap))
        return config

    # -------------------------------------------------------------------------------------------- config out
    def matches(self, config: ModelConfig) -> bool:
        """Gemma's layer (zero-centred RMSNorm with post-norms, GeGLU, scaled embedding, a window, no biases, no
        experts) without q/k norm, one plain RoPE; soft-capping optional."""
        return (config.normalization == "RMSNorm" and config.activation == "geglu" and not config.qk_layernorm
                and not config.is_moe and not config.multi_latent_attention
                and config.layernorm_zero_centered_gamma and config.post_norms
                and config.scale_embeddings_by_sqrt_hidden and config.window_size is not None
                and not (config.add_qkv_bias or config.add_bias_linear or config.has_attention_output_bias)
                and not config.rope_scaling and config.position_embedding_type == "rope"
                and config.rotary_base_local is None and config.softmax_type == "vanilla")

    def config_to_hf(self, config: ModelConfig, *, rope_format: RopeFormat = "rope_parameters",
                     dtype: str = "float32") -> dict[str, Any]:
        """The shared keys with the shared RoPE keys (without ``hidden_act``), then Gemma's."""
        if not self.matches(config):
            raise BridgeError(f"the model (activation={config.activation!r}, post_norms={config.post_norms}, "
                              f"qk_layernorm={config.qk_layernorm}, window_size={config.window_size}, "
                              f"rotary_base_local={config.rotary_base_local}) is not a gemma2 model")
        out = ModelFamily.config_to_hf(self, config, rope_format=rope_format, dtype=dtype)
        return {k: v for k, v in out.items() if k != "hidden_act"}
