"""Mixtral's Hugging Face mapping: Mistral's config and attention, and in every layer a router
``block_sparse_moe.gate`` (ours ``mlp.router``) and ``num_local_experts`` SwiGLU experts stored one tensor per expert
on the HF side (``block_sparse_moe.experts.{j}.w1`` gate, ``w3`` up, ``w2`` down, ``[out, in]``) and stacked on ours
(``mlp.experts.gate_proj`` ``[E, hidden, F]``, transposed per expert). Routing is the softmax over the k selected
logits (``moe_router_pre_softmax=False``), which equals HF's softmax over all experts renormalized over the top k."""

from functools import partial
from typing import Any

from megatron_bridge.bridge.families.base import ModelFamily, StackedWeight
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError
from megatron_bridge.families.mistral.bridge import MistralFamily


EXPERTS = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
"""Our stacked expert tensor → HF's per-expert name."""


class MixtralFamily(MistralFamily):
    """Names and defaults of transformers' ``MixtralConfig``."""

    moe = True
    hf_defaults = {**MistralFamily.hf_defaults, "sliding_window": None, "num_experts_per_tok": 2,
                   "router_aux_loss_coef": 0.001}
    fixed_hf_values = {**MistralFamily.fixed_hf_values, "router_jitter_noise": (0, 0.0, None)}
    ignored_hf_keys = MistralFamily.ignored_hf_keys | {"output_router_logits"}
    mapped_hf_keys = MistralFamily.mapped_hf_keys | {"num_local_experts", "num_experts_per_tok",
                                                     "router_aux_loss_coef"}

    def config_from_hf(self, hf: dict[str, Any]) -> ModelConfig:
        """Mistral's fields plus the experts: every layer MoE, expert width ``intermediate_size``."""
        config = super().config_from_hf(hf)
        get = partial(self.hf_value, hf)
        if not hf.get("num_local_experts"):
            raise BridgeError("mixtral config.json needs num_local_experts")
        config.num_moe_experts = int(hf["num_local_experts"])
        config.moe_ffn_hidden_size = config.ffn_hidden_size
        config.moe_router_topk = int(get("num_experts_per_tok"))
        config.moe_router_score_function = "softmax"
        config.moe_router_pre_softmax = False
        config.moe_aux_loss_coeff = float(get("router_aux_loss_coef"))
        config.moe_layer_freq = 1
        config.moe_grouped_gemm = True
        return config

    def matches(self, config: ModelConfig) -> bool:
        """Mistral's attention with softmax top-k experts renormalized over the k in every layer, no shared expert."""
        return (super().matches(config) and all(config.moe_layer_pattern())
                and config.moe_router_score_function == "softmax" and not config.moe_router_pre_softmax
                and not config.moe_shared_expert_intermediate_size and not config.moe_router_enable_expert_bias
                and config.moe_router_topk_scaling_factor is None
                and config.expert_ffn_hidden_size == config.ffn_hidden_size)

    def extra_hf_config(self, config: ModelConfig) -> dict[str, Any]:
        """Mistral's keys plus the experts."""
        return {**super().extra_hf_config(config), "num_local_experts": config.num_moe_experts,
                "num_experts_per_tok": config.moe_router_topk, "router_aux_loss_coef": config.moe_aux_loss_coeff,
                "router_jitter_noise": 0.0, "output_router_logits": False}

    def weight_names(self, config: ModelConfig) -> dict[str, str]:
        """1:1 names: Llama's attention and norms; the router ``mlp.router.weight`` ↔ ``block_sparse_moe.gate``."""
        names = ModelFamily.weight_names(self, config)
        for i in range(config.num_layers):
            for proj in EXPERTS:
                del names[f"layers.{i}.mlp.{proj}.weight"]
            names[f"layers.{i}.mlp.router.weight"] = f"model.layers.{i}.block_sparse_moe.gate.weight"
        return names

    def stacked_weights(self, config: ModelConfig) -> dict[str, StackedWeight]:
        """Each layer's expert tensors: ours ``[E, in, out]`` = stack of HF's per-expert ``[out, in]``."""
        experts = range(config.num_moe_experts or 0)
        return {f"layers.{i}.mlp.experts.{proj}": StackedWeight(
                    tuple(f"model.layers.{i}.block_sparse_moe.experts.{j}.{hf}.weight" for j in experts),
                    transpose=True)
                for i in range(config.num_layers) for proj, hf in EXPERTS.items()}
