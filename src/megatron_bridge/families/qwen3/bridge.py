"""Qwen3 dense (``Qwen3ForCausalLM``): the Llama layout plus per-head q/k RMSNorm, ``head_dim`` independent of
the width, RoPE base 1e6, tied embeddings for the small sizes. No MLP biases; sliding-window attention is refused."""

from typing import Any

from megatron_bridge.bridge.families.base import ModelFamily
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError


class Qwen3Family(ModelFamily):
    """Names and defaults of transformers' ``Qwen3Config``."""

    qk_layernorm = True
    hf_defaults = {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "attention_bias": False,
                   "head_dim": 128, "num_key_value_heads": 32, "tie_word_embeddings": False}
    fixed_hf_values = {**ModelFamily.fixed_hf_values, "use_sliding_window": (False, None)}
    ignored_hf_keys = frozenset({"sliding_window", "max_window_layers"})
    mapped_hf_keys = ModelFamily.mapped_hf_keys | {"layer_types"}

    def check_hf_config(self, hf: dict[str, Any]) -> None:
        """Also: every ``layer_types`` entry must be full attention; ``mlp_bias`` is not a Qwen3 key."""
        super().check_hf_config(hf)
        layer_types = hf.get("layer_types") or []
        if any(t != "full_attention" for t in layer_types):
            raise BridgeError(f"config.json layer_types={sorted(set(layer_types))}: only full attention is supported")
        if hf.get("mlp_bias"):
            raise BridgeError("config.json mlp_bias=true is not a Qwen3 setting")

    def matches(self, config: ModelConfig) -> bool:
        """RMSNorm + SwiGLU with q/k norm and no MLP biases."""
        return super().matches(config) and not config.add_bias_linear

    def extra_hf_config(self, config: ModelConfig) -> dict[str, Any]:
        """Full attention everywhere (no sliding window)."""
        return {"use_sliding_window": False, "sliding_window": None, "max_window_layers": config.num_layers,
                "layer_types": ["full_attention"] * config.num_layers}
