"""Mistral's Hugging Face mapping: Llama's weight names; ``sliding_window = W`` (W tokens including the current one,
or null for full attention) is ``model.window_size = (W - 1, 0)`` in every layer. Mistral has no bias keys."""

from typing import Any

from megatron_bridge.bridge.families.base import ModelFamily
from megatron_bridge.bridge.rope import RopeFormat
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError


class MistralFamily(ModelFamily):
    """Names and defaults of transformers' ``MistralConfig``."""

    hf_defaults = {"max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                   "sliding_window": 4096}
    mapped_hf_keys = (ModelFamily.mapped_hf_keys - {"attention_bias", "mlp_bias"}) | {"sliding_window"}

    def config_from_hf(self, hf: dict[str, Any]) -> ModelConfig:
        """Llama's fields plus the window (``sliding_window``, transformers' default 4096 when the key is absent)."""
        config = super().config_from_hf(hf)
        window = hf["sliding_window"] if "sliding_window" in hf else self.hf_defaults["sliding_window"]
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise BridgeError(f"config.json sliding_window={window!r} must be a positive number of tokens or null")
        config.window_size = (window - 1, 0) if window is not None else None
        return config

    def matches(self, config: ModelConfig) -> bool:
        """RMSNorm + SwiGLU without q/k norm, experts or biases, with the window (if any) in every layer."""
        return (super().matches(config) and not config.add_qkv_bias and not config.add_bias_linear
                and not config.has_attention_output_bias and config.window_attn_skip_freq is None)

    def config_to_hf(self, config: ModelConfig, *, rope_format: RopeFormat = "rope_parameters",
                     dtype: str = "float32") -> dict[str, Any]:
        """Llama's keys without ``attention_bias`` (Mistral has none), plus ``sliding_window``."""
        out = super().config_to_hf(config, rope_format=rope_format, dtype=dtype)
        del out["attention_bias"]
        return out

    def extra_hf_config(self, config: ModelConfig) -> dict[str, Any]:
        """``sliding_window``: W = window_size[0] + 1, or null for full attention."""
        return {"sliding_window": config.window_size[0] + 1 if config.window_size is not None else None}
