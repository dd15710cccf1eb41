"""DeepSeek-V2's Hugging Face mapping (transformers' ``DeepseekV2Config``): the DeepSeek-V3 mapping
(``families/deepseek_v3/bridge.py``: MLA widths, YaRN, dense first layers, shared experts, the weight names) with
V2's router:

* ``scoring_func`` softmax over every expert, no ``e_score_correction_bias`` (no expert bias);
* ``topk_method`` "greedy" (plain top-k; ``n_group``/``topk_group`` unused) or "group_limited_greedy" (groups kept
  by their best expert: ``moe_router_num_groups``/``moe_router_group_topk``, ``models/moe.py::limit_to_groups``);
* ``norm_topk_prob`` false: the k softmax probabilities as they are (``moe_router_pre_softmax=True``); true: normalized
  over the k, which is the softmax of the k logits (``moe_router_pre_softmax=False``);
* ``routed_scaling_factor`` → ``moe_router_topk_scaling_factor`` (V2-Lite: 1.0).

The training-only settings of DeepSeek-V2's own config.json (not transformers' fields) are read when present:
``aux_loss_alpha`` (default 0.001, V2-Lite's) as the sequence-level aux loss (``seq_aux`` true). No multi-token
prediction. RoPE pairs are interleaved as in V3 (transformers' V2 rotates complex pairs ``(x[2i], x[2i+1])``).
"""

from typing import Any

from megatron_bridge.bridge.families.base import ModelFamily
from megatron_bridge.bridge.rope import RopeFormat
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError
from megatron_bridge.families.deepseek_v3.bridge import DeepseekV3Family


_GROUP_KEYS = ("n_group", "topk_group")
"""Unused (may be null) with ``topk_method='greedy'``."""


class DeepseekV2Family(DeepseekV3Family):
    """Names and defaults of transformers' ``DeepseekV2Config`` (module docstring)."""

    hf_defaults = {**DeepseekV3Family.hf_defaults, "max_position_embeddings": 2048, "n_routed_experts": 64,
                   "moe_intermediate_size": 1407, "n_shared_experts": 2, "first_k_dense_replace": 0,
                   "routed_scaling_factor": 1.0, "n_group": None, "topk_group": None, "norm_topk_prob": False,
                   "topk_method": "greedy", "aux_loss_alpha": 1e-3, "num_experts_per_tok": None}
    fixed_hf_values = {**ModelFamily.fixed_hf_values, "attention_bias": (False, None), "mlp_bias": (False, None),
                       "scoring_func": ("softmax", None), "moe_layer_freq": (1, None), "ep_size": (1, None),
                       "seq_aux": (True, None)}
    ignored_hf_keys = frozenset({"output_router_logits", "auto_map", "num_nextn_predict_layers"})
    mapped_hf_keys = DeepseekV3Family.mapped_hf_keys | {"norm_topk_prob", "topk_method"}

    # --------------------------------------------------------------------------------------------- config in
    def _moe_from_hf(self, config: ModelConfig, get: Any) -> None:
        """DeepSeek-V3's experts, then V2's router (module docstring)."""
        super()._moe_from_hf(config, lambda key: (get(key) or 1) if key in _GROUP_KEYS else get(key))
        method = get("topk_method")
        if method not in ("greedy", "group_limited_greedy"):
            raise BridgeError(f"deepseek_v2 config.json topk_method={method!r}: only 'greedy' and "
                              "'group_limited_greedy' are DeepSeek-V2's routers")
        config.moe_router_score_function = "softmax"
        config.moe_router_enable_expert_bias = False
        config.moe_router_pre_softmax = not bool(get("norm_topk_prob"))
        if method == "greedy":
            config.moe_router_num_groups = config.moe_router_group_topk = None
        elif get("n_group") is None or get("topk_group") is None:
            raise BridgeError("deepseek_v2 config.json topk_method='group_limited_greedy' needs n_group and topk_group")

    def config_for_folder(self, config: ModelConfig, hf: dict[str, Any], tensor_names: list[str]) -> None:
        """Nothing: DeepSeek-V2 has no multi-token prediction layers."""

    # -------------------------------------------------------------------------------------------- config out
    def matches(self, config: ModelConfig) -> bool:
        """MLA without biases, dense layers first then MoE layers with shared experts and softmax routing without
        an expert bias or multi-token prediction."""
        pattern = config.moe_layer_pattern()
        dense = pattern.index(True) if True in pattern else len(pattern)
        shared = config.moe_shared_expert_intermediate_size or 0
        return (ModelFamily.matches(self, config) and config.multi_latent_attention and not config.add_qkv_bias
                and not config.has_attention_output_bias and all(pattern[dense:])
                and config.moe_router_score_function == "softmax" and not config.moe_router_enable_expert_bias
                and shared > 0 and shared % config.expert_ffn_hidden_size == 0 and not config.mtp_depths)

    def config_to_hf(self, config: ModelConfig, *, rope_format: RopeFormat = "rope_parameters",
                     dtype: str = "float32") -> dict[str, Any]:
        """DeepSeek-V3's keys without its own (``rope_interleave``, ``num_nextn_predict_layers``), V2's router."""
        out = super().config_to_hf(config, rope_format=rope_format, dtype=dtype)
        for key in ("rope_interleave", "num_nextn_predict_layers"):
            out.pop(key, None)
        groups = config.moe_router_num_groups
        out.update({"topk_method": "greedy" if groups is None else "group_limited_greedy",
                    "norm_topk_prob": not config.moe_router_pre_softmax, "n_group": groups,
                    "topk_group": config.moe_router_group_topk})
        return out
