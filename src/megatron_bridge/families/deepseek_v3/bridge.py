"""DeepSeek-V3's Hugging Face mapping (transformers' ``DeepseekV3Config``; Moonlight's checkpoints use it too).

Config: the MLA widths map to megatron-core's names (``qk_nope_head_dim`` → ``qk_head_dim``, ``qk_rope_head_dim`` →
``qk_pos_emb_head_dim``, ``q_lora_rank`` null → a plain ``q_proj``); ``head_dim`` and ``qk_head_dim`` are derived and
checked; ``rope_parameters`` (YaRN) as every family reads it; ``first_k_dense_replace`` k →
``moe_layer_freq = [0] * k + [1] * (L - k)``; ``n_routed_experts``, ``num_experts_per_tok``,
``moe_intermediate_size``, ``n_shared_experts`` (times ``moe_intermediate_size``:
``moe_shared_expert_intermediate_size``), ``n_group``/``topk_group`` → ``moe_router_num_groups``/
``moe_router_group_topk``, ``routed_scaling_factor`` → ``moe_router_topk_scaling_factor``; sigmoid routing with the
expert bias, normalized (``norm_topk_prob`` must be true), interleaved RoPE pairs (``rope_interleave`` must be true)
and no attention biases.
The training-only settings of Megatron-Bridge's DeepSeek provider are set on import: sequence-level aux loss with
``aux_loss_alpha`` (default 1e-4), expert-bias update rate 1e-3.

Multi-token prediction (``models/mtp.py``): a folder that stores the MTP layers (``model.layers.{L + k}``, at most
``num_nextn_predict_layers`` of them; transformers drops them when it loads a model, so a folder it wrote has none)
imports with ``mtp_num_layers`` set to their number (:meth:`DeepseekV3Family.config_for_folder`; the config alone
never sets it). Each layer's ``enorm``, ``hnorm``, ``eh_proj`` map 1:1, ``shared_head.norm`` ↔ our
``final_layernorm``, its decoder-layer tensors ↔ our ``transformer_layer``; its ``embed_tokens`` and
``shared_head.head`` are copies of the main ones (our model shares them): compared on import, written again on export.
With ``mtp_num_layers`` None or 0 the MTP tensors are dropped on import and export writes
``num_nextn_predict_layers: 0`` (a source config.json's own value is kept).

fp8 checkpoints (``quantization_config``: DeepSeek-V3's published weights) are dequantized on import (``fp8.py``:
each weight times its ``weight_scale_inv`` block scale); exports write the unquantized weights without
``quantization_config``.

Weights: names are transformers' under ``model.`` (our module names follow ``DeepseekV3Attention``); the router
``mlp.router.weight`` ↔ ``mlp.gate.weight``, its bias buffer ``mlp.router.expert_bias`` ↔
``mlp.gate.e_score_correction_bias``; routed experts stacked on our side (``[E, in, out]``), one ``[out, in]``
tensor per expert on HF's (``mlp.experts.{j}.{gate,up,down}_proj.weight``).
"""

from functools import partial
from typing import Any

from megatron_bridge.bridge.families.base import HF_DECODER, ModelFamily, StackedWeight
from megatron_bridge.bridge.rope import RopeFormat
from megatron_bridge.config import decoder_names as n
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError


_MISSING = object()
_SHARED_HEAD = "shared_head"
"""HF's name of an MTP layer's output part: ``shared_head.norm`` (our ``final_layernorm``) and ``shared_head.head``
(a copy of the output layer)."""


class DeepseekV3Family(ModelFamily):
    """Names and defaults of transformers' ``DeepseekV3Config``."""

    moe = True
    mla = True
    hf_defaults = {"max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                   "kv_lora_rank": 512, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
                   "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
                   "n_shared_experts": 1, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3,
                   "routed_scaling_factor": 2.5, "aux_loss_alpha": 1e-4}
    q_lora_default = 1536
    """transformers' ``q_lora_rank`` when the key is absent (an explicit null means no query latent)."""
    fixed_hf_values = {**ModelFamily.fixed_hf_values, "attention_bias": (False, None), "mlp_bias": (False, None),
                       "rope_interleave": (True, None), "norm_topk_prob": (True, None),
                       "scoring_func": ("sigmoid", None), "topk_method": ("noaux_tc", None),
                       "moe_layer_freq": (1, None), "ep_size": (1, None)}
    ignored_hf_keys = frozenset({"output_router_logits", "num_nextn_predict_layers", "num_mtp_layers", "seq_aux",
                                 "auto_map"})
    mapped_hf_keys = ModelFamily.mapped_hf_keys | {
        "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "qk_head_dim",
        "n_routed_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
        "n_group", "topk_group", "first_k_dense_replace", "routed_scaling_factor", "aux_loss_alpha",
        "quantization_config",
    }

    # --------------------------------------------------------------------------------------------- config in
    def config_from_hf(self, hf: dict[str, Any]) -> ModelConfig:
        """The shared fields, then MLA and the experts (module docstring)."""
        if hf.get("quantization_config") is not None:
            from megatron_bridge.families.deepseek_v3.fp8 import check_quantization_config

            check_quantization_config(hf["quantization_config"])
        config = super().config_from_hf({k: v for k, v in hf.items() if k != "head_dim"})
        get = partial(self.hf_value, hf)
        try:
            self._mla_from_hf(config, hf, get)
            self._moe_from_hf(config, get)
        except (TypeError, ValueError) as exc:
            raise BridgeError(f"deepseek_v3 config.json has a bad field: {type(exc).__name__}: {exc}") from exc
        return config

    def _mla_from_hf(self, config: ModelConfig, hf: dict[str, Any], get: Any) -> None:
        heads = config.num_attention_heads
        if config.num_kv_heads != heads:
            raise BridgeError(f"deepseek_v3 config.json num_key_value_heads={config.num_kv_heads} must equal "
                              f"num_attention_heads={heads} (multi-latent attention has a key and value per head)")
        q_lora = hf.get("q_lora_rank", _MISSING)
        config.multi_latent_attention = True
        config.q_lora_rank = self.q_lora_default if q_lora is _MISSING else (None if q_lora is None else int(q_lora))
        config.kv_lora_rank = int(get("kv_lora_rank"))
        config.qk_head_dim, config.qk_pos_emb_head_dim = int(get("qk_nope_head_dim")), int(get("qk_rope_head_dim"))
        config.v_head_dim = int(get("v_head_dim"))
        config.kv_channels, config.num_query_groups = None, None
        config.add_qkv_bias = config.attention_output_bias = False
        derived = {"head_dim": config.qk_pos_emb_head_dim,
                   "qk_head_dim": config.qk_head_dim + config.qk_pos_emb_head_dim}
        for key, want in derived.items():
            if hf.get(key) is not None and int(hf[key]) != want:
                raise BridgeError(f"deepseek_v3 config.json {key}={hf[key]} differs from the {want} that "
                                  "qk_nope_head_dim and qk_rope_head_dim give")

    @staticmethod
    def _moe_from_hf(config: ModelConfig, get: Any) -> None:
        dense, layers = int(get("first_k_dense_replace")), config.num_layers
        shared = int(get("n_shared_experts")) * int(get("moe_intermediate_size"))
        if not shared:
            raise BridgeError("deepseek_v3 config.json n_shared_experts must be >= 1 (transformers builds them)")
        config.num_moe_experts = int(get("n_routed_experts"))
        config.moe_ffn_hidden_size = int(get("moe_intermediate_size"))
        config.moe_shared_expert_intermediate_size = shared
        config.moe_router_topk = int(get("num_experts_per_tok"))
        config.moe_router_score_function = "sigmoid"
        config.moe_router_enable_expert_bias = True
        config.moe_router_bias_update_rate = 1e-3
        config.moe_router_topk_scaling_factor = float(get("routed_scaling_factor"))
        config.moe_router_num_groups, config.moe_router_group_topk = int(get("n_group")), int(get("topk_group"))
        config.moe_router_load_balancing_type = "seq_aux_loss"
        config.moe_aux_loss_coeff = float(get("aux_loss_alpha"))
        config.moe_layer_freq = 1 if dense == 0 else [0] * min(dense, layers) + [1] * max(layers - dense, 0)
        config.moe_grouped_gemm = True

    # -------------------------------------------------------------------------------------------- config out
    def matches(self, config: ModelConfig) -> bool:
        """MLA without biases, dense layers first then MoE layers with shared experts and biased sigmoid routing."""
        pattern = config.moe_layer_pattern()
        dense = pattern.index(True) if True in pattern else len(pattern)
        shared = config.moe_shared_expert_intermediate_size or 0
        return (super().matches(config) and not config.add_qkv_bias and not config.has_attention_output_bias
                and all(pattern[dense:]) and config.moe_router_score_function == "sigmoid"
                and config.moe_router_enable_expert_bias and shared > 0
                and shared % config.expert_ffn_hidden_size == 0)

    def config_to_hf(self, config: ModelConfig, *, rope_format: RopeFormat = "rope_parameters",
                     dtype: str = "float32") -> dict[str, Any]:
        """The shared keys (``head_dim`` the RoPE width, as transformers derives it), then MLA and the experts."""
        out = super().config_to_hf(config, rope_format=rope_format, dtype=dtype)
        out["head_dim"] = config.qk_pos_emb_head_dim
        return out

    def extra_hf_config(self, config: ModelConfig) -> dict[str, Any]:
        """MLA widths, experts, groups, the MTP depths and the fixed DeepSeek-V3 keys."""
        pattern = config.moe_layer_pattern()
        return {
            "q_lora_rank": config.q_lora_rank, "kv_lora_rank": config.kv_lora_rank,
            "qk_nope_head_dim": config.qk_head_dim, "qk_rope_head_dim": config.qk_pos_emb_head_dim,
            "qk_head_dim": config.qk_head_dim + config.qk_pos_emb_head_dim, "v_head_dim": config.v_head_dim,
            "n_routed_experts": config.num_moe_experts, "num_experts_per_tok": config.moe_router_topk,
            "moe_intermediate_size": config.expert_ffn_hidden_size,
            "n_shared_experts": (config.moe_shared_expert_intermediate_size or 0) // config.expert_ffn_hidden_size,
            "n_group": config.moe_router_num_groups or 1, "topk_group": config.moe_router_group_topk or 1,
            "first_k_dense_replace": pattern.index(True) if True in pattern else len(pattern),
            "routed_scaling_factor": config.moe_router_topk_scaling_factor or 1.0, "norm_topk_prob": True,
            "rope_interleave": True, "num_nextn_predict_layers": config.mtp_depths, "output_router_logits": False,
            "pretraining_tp": 1,
        }

    # --------------------------------------------------------------------------------------------- weights
    def weight_names(self, config: ModelConfig) -> dict[str, str]:
        """1:1 names under ``model.`` (module docstring); routed experts are :meth:`stacked_weights`."""
        names = {name: f"{HF_DECODER}.{name}" for name in (f"{n.EMBEDDING}.weight", f"{n.FINAL_NORM}.weight")}
        names[f"{n.OUTPUT}.weight"] = f"{n.OUTPUT}.weight"
        for i, moe in enumerate(config.moe_layer_pattern()):
            names.update(self._layer_names(config, n.layer(i), f"{HF_DECODER}.{n.layer(i)}", moe))
        last_moe = config.moe_layer_pattern()[-1]
        for i in n.mtp_layer_indices(config):
            ours, hf = n.mtp_layer(i), f"{HF_DECODER}.{n.layer(i)}"
            names.update({f"{ours}.{sub}.weight": f"{hf}.{sub}.weight"
                          for sub in (n.MTP_ENORM, n.MTP_HNORM, n.MTP_EH_PROJ)})
            names[f"{ours}.{n.MTP_NORM}.weight"] = f"{hf}.{_SHARED_HEAD}.norm.weight"
            names.update(self._layer_names(config, f"{ours}.{n.MTP_LAYER}", hf, last_moe))
        return names

    @staticmethod
    def _layer_names(config: ModelConfig, ours: str, hf: str, moe: bool) -> dict[str, str]:
        """One decoder layer's names (ours under ``ours``, HF's under ``hf``), the routed experts left out."""
        inside = [f"{n.ATTENTION_NORM}.weight", f"{n.MLP_NORM}.weight",
                  *(f"{n.ATTENTION}.{p}" for p in n.mla_parameters(config))]
        if moe:
            inside += [f"{n.MLP}.{n.SHARED_EXPERTS}.{p}.weight" for p in n.MLP_PROJECTIONS]
        else:
            inside += [f"{n.MLP}.{p}.weight" for p in n.MLP_PROJECTIONS]
        names = {f"{ours}.{name}": f"{hf}.{name}" for name in inside}
        if moe:
            names[f"{ours}.{n.MLP}.{n.ROUTER}.weight"] = f"{hf}.{n.MLP}.gate.weight"
        if moe and config.moe_router_enable_expert_bias:  # DeepSeek-V2 routes without it
            names[f"{ours}.{n.MLP}.{n.ROUTER}.expert_bias"] = f"{hf}.{n.MLP}.gate.e_score_correction_bias"
        return names

    def stacked_weights(self, config: ModelConfig) -> dict[str, StackedWeight]:
        """Each MoE layer's expert tensors: ours ``[E, in, out]`` = stack of HF's per-expert ``[out, in]``."""
        experts = range(config.num_moe_experts or 0)
        layers = [(n.layer(i), n.layer(i)) for i, moe in enumerate(config.moe_layer_pattern()) if moe]
        if config.moe_layer_pattern()[-1]:
            layers += [(f"{n.mtp_layer(i)}.{n.MTP_LAYER}", n.layer(i)) for i in n.mtp_layer_indices(config)]
        return {f"{ours}.{n.MLP}.{n.EXPERTS}.{proj}": StackedWeight(
                    tuple(f"{HF_DECODER}.{hf}.{n.MLP}.{n.EXPERTS}.{j}.{proj}.weight" for j in experts), transpose=True)
                for ours, hf in layers for proj in n.EXPERT_WEIGHTS}

    def copied_weights(self, config: ModelConfig) -> dict[str, str]:
        """Each MTP layer's copies of the embedding (``embed_tokens``) and of the output layer
        (``shared_head.head``), which megatron-core and this library share with the main model."""
        output = f"{n.EMBEDDING if config.share_embeddings_and_output_weights else n.OUTPUT}.weight"
        out = {}
        for i in n.mtp_layer_indices(config):
            out[f"{HF_DECODER}.{n.layer(i)}.{n.EMBEDDING}.weight"] = f"{n.EMBEDDING}.weight"
            out[f"{HF_DECODER}.{n.layer(i)}.{_SHARED_HEAD}.head.weight"] = output
        return out

    def config_for_folder(self, config: ModelConfig, hf: dict[str, Any], tensor_names: list[str]) -> None:
        """``mtp_num_layers``: the MTP layers the folder stores (``model.layers.{L + k}.eh_proj.weight``), at most
        ``num_nextn_predict_layers``; None when it stores none (a folder transformers wrote: it drops them)."""
        names, wanted = set(tensor_names), int(hf.get("num_nextn_predict_layers") or 0)
        depths = 0
        while depths < wanted and f"{HF_DECODER}.{n.layer(config.num_layers + depths)}.eh_proj.weight" in names:
            depths += 1
        config.mtp_num_layers = depths or None

    def read_hf_tensor(self, reader: Any, name: str) -> Any:
        """The stored tensor; an fp8 weight with its block scales dequantized to float32 (``fp8.py``)."""
        from megatron_bridge.families.deepseek_v3.fp8 import read_dequantized

        return read_dequantized(reader, name)

    def ignorable_hf_weight(self, name: str, config: ModelConfig) -> bool:
        """The shared ones, the fp8 block scales (read with their weights), and the multi-token-prediction layers
        (``model.layers.{L + i}...``) the model does not build (all with ``mtp_num_layers`` None or 0)."""
        if name.endswith(".weight_scale_inv"):
            return True
        prefix = f"{HF_DECODER}.{n.LAYERS}."
        if name.startswith(prefix):
            index = name[len(prefix):].split(".", 1)[0]
            if index.isdigit() and int(index) >= config.num_layers + config.mtp_depths:
                return True
        return super().ignorable_hf_weight(name, config)
