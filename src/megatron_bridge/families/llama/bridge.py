"""Llama 3 / 3.1 / 3.2 (``LlamaForCausalLM``): RMSNorm, SwiGLU, GQA, RoPE with optional llama3 scaling, optional
tied embeddings, q/k/v/o biases (``attention_bias``) and MLP biases (``mlp_bias``)."""

from typing import Any

from megatron_bridge.bridge.families.base import ModelFamily
from megatron_bridge.config.model import ModelConfig


class LlamaFamily(ModelFamily):
    """Names and defaults of transformers' ``LlamaConfig``."""

    qk_layernorm = False
    hf_defaults = {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "attention_bias": False,
                   "mlp_bias": False, "tie_word_embeddings": False}

    def extra_hf_config(self, config: ModelConfig) -> dict[str, Any]:
        """``mlp_bias`` and ``pretraining_tp`` (always 1)."""
        return {"mlp_bias": config.add_bias_linear, "pretraining_tp": 1}

    def matches(self, config: ModelConfig) -> bool:
        """RMSNorm + SwiGLU without q/k norm."""
        return super().matches(config)
