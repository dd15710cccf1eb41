"""Qwen3-MoE (``Qwen3MoeForCausalLM``): Qwen3 attention (q/k norm, head_dim 128) with sparse MoE MLPs — a router
``mlp.gate`` and ``num_experts`` SwiGLU experts stored one tensor per expert on the HF side
(``mlp.experts.{j}.{gate,up,down}_proj.weight``, ``[out, in]``) and stacked on ours (``mlp.experts.gate_proj``
``[E, hidden, F]``, transposed per expert). ``norm_topk_prob`` is ``not moe_router_pre_softmax``; layers listed in
``mlp_only_layers`` or off the ``decoder_sparse_step`` grid keep a dense MLP (``intermediate_size``)."""

from functools import partial
from typing import Any

from megatron_bridge.bridge.families.base import ModelFamily, StackedWeight
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError
from megatron_bridge.families.qwen3.bridge import Qwen3Family


EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


class Qwen3MoeFamily(Qwen3Family):
    """Names and defaults of transformers' ``Qwen3MoeConfig``."""

    moe = True
    hf_defaults = {**Qwen3Family.hf_defaults, "num_key_value_heads": 4, "decoder_sparse_step": 1,
                   "norm_topk_prob": False, "router_aux_loss_coef": 0.001, "num_experts_per_tok": 8}
    ignored_hf_keys = Qwen3Family.ignored_hf_keys | {"output_router_logits"}
    mapped_hf_keys = Qwen3Family.mapped_hf_keys | {
        "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
        "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef",
    }

    def config_from_hf(self, hf: dict[str, Any]) -> ModelConfig:
        """The Qwen3 fields plus the MoE ones (module docstring)."""
        config = super().config_from_hf(hf)
        get = partial(self.hf_value, hf)
        experts = hf.get("num_experts", hf.get("num_local_experts"))
        if not experts or hf.get("moe_intermediate_size") is None:
            raise BridgeError("qwen3_moe config.json needs num_experts (or num_local_experts) and "
                              "moe_intermediate_size")
        step, dense = int(get("decoder_sparse_step")), set(get("mlp_only_layers") or [])
        pattern = [int(i not in dense and (i + 1) % step == 0) for i in range(config.num_layers)]
        config.num_moe_experts = int(experts)
        config.moe_ffn_hidden_size = int(hf["moe_intermediate_size"])
        config.moe_router_topk = int(get("num_experts_per_tok"))
        config.moe_router_score_function = "softmax"
        config.moe_router_pre_softmax = not bool(get("norm_topk_prob"))
        config.moe_aux_loss_coeff = float(get("router_aux_loss_coef"))
        config.moe_layer_freq = 1 if all(pattern) else pattern
        config.moe_grouped_gemm = True
        return config

    def matches(self, config: ModelConfig) -> bool:
        """Qwen3 attention with softmax-routed experts and no shared expert."""
        return (super().matches(config) and config.moe_router_score_function == "softmax"
                and not config.moe_shared_expert_intermediate_size and not config.moe_router_enable_expert_bias
                and config.moe_router_topk_scaling_factor is None)

    def extra_hf_config(self, config: ModelConfig) -> dict[str, Any]:
        """Qwen3's keys plus the MoE ones."""
        pattern = config.moe_layer_pattern()
        return {
            **super().extra_hf_config(config),
            "num_experts": config.num_moe_experts, "num_experts_per_tok": config.moe_router_topk,
            "moe_intermediate_size": config.expert_ffn_hidden_size,
            "norm_topk_prob": not config.moe_router_pre_softmax, "decoder_sparse_step": 1,
            "mlp_only_layers": [i for i, moe in enumerate(pattern) if not moe],
            "router_aux_loss_coef": config.moe_aux_loss_coeff, "output_router_logits": False,
        }

    def weight_names(self, config: ModelConfig) -> dict[str, str]:
        """1:1 names: dense layers as Qwen3; MoE layers' router ``mlp.router.weight`` ↔ ``mlp.gate.weight``."""
        names = ModelFamily.weight_names(self, config)
        for i, moe in enumerate(config.moe_layer_pattern()):
            if not moe:
                continue
            for proj in EXPERT_PROJECTIONS:
                del names[f"layers.{i}.mlp.{proj}.weight"]
            names[f"layers.{i}.mlp.router.weight"] = f"model.layers.{i}.mlp.gate.weight"
        return names

    def stacked_weights(self, config: ModelConfig) -> dict[str, StackedWeight]:
        """Each MoE layer's expert tensors: ours ``[E, in, out]`` = stack of HF's per-expert ``[out, in]``."""
        out = {}
        for i, moe in enumerate(config.moe_layer_pattern()):
            if not moe:
                continue
            for proj in EXPERT_PROJECTIONS:
                hf = [f"model.layers.{i}.mlp.experts.{j}.{proj}.weight" for j in range(config.num_moe_experts or 0)]
                out[f"layers.{i}.mlp.experts.{proj}"] = StackedWeight(tuple(hf), transpose=True)
        return out
