"""GPT-OSS's Hugging Face mapping (transformers' ``GptOssConfig``).

Config: ``sliding_window = W`` (W tokens including the current one) is ``model.window_size = (W - 1, 0)``,
``layer_types`` (``sliding_attention``/``full_attention`` per layer) ``model.window_attn_skip_freq`` as a 0/1 list;
``rope_parameters`` (YaRN) as every family reads it; ``swiglu_limit`` is ``model.activation_func_clamp_value``
(``swiglu_alpha`` must be 1.702: quick GELU); ``num_local_experts``, ``num_experts_per_tok``, ``intermediate_size``
(the expert width), ``router_aux_loss_coef`` map to the ``moe_*`` fields; sinks (``softmax_type="learnable"``),
``glu_linear_offset=1``, biases everywhere (``add_qkv_bias``, ``add_bias_linear``) are fixed. MXFP4-quantized
checkpoints (``quantization_config.quant_method: mxfp4``, the published weights: the experts' ``*_blocks`` and
``*_scales``) are dequantized on import, one tensor at a time (``mxfp4.py``); exports write the unquantized weights
(float32 or bfloat16, as asked) without ``quantization_config``.

Weights: transformers' names under ``model.``; the router ``mlp.router.{weight,bias}`` and ``mlp.experts.down_proj``
(``[E, F, hidden]``) are ours as they are; ``mlp.experts.gate_up_proj`` ``[E, hidden, 2F]`` holds our ``gate_proj``
(even columns) and ``up_proj`` (odd columns) interleaved, ``gate_up_proj_bias`` ``[E, 2F]`` our ``gate_bias`` and
``up_bias`` alike (:class:`~megatron_bridge.bridge.families.base.InterleavedWeight`); ``down_proj_bias`` is our
``down_bias``.
"""

from functools import partial
from typing import Any

from megatron_bridge.bridge.families.base import HF_DECODER, InterleavedWeight, ModelFamily
from megatron_bridge.bridge.rope import RopeFormat
from megatron_bridge.config import decoder_names as n
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError


SLIDING, FULL = "sliding_attention", "full_attention"
ALPHA = 1.702
"""The quick-GELU slope of GPT-OSS's gate (``swiglu_alpha``), the only one supported."""


class GptOssFamily(ModelFamily):
    """Names and defaults of transformers' ``GptOssConfig``."""

    moe = True
    hf_defaults = {"max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "head_dim": 64,
                   "num_key_value_heads": 8, "tie_word_embeddings": False, "sliding_window": 128,
                   "num_local_experts": 128, "num_experts_per_tok": 4, "swiglu_limit": 7.0,
                   "router_aux_loss_coef": 0.001, "attention_bias": True}
    fixed_hf_values = {**ModelFamily.fixed_hf_values, "attention_bias": (True, None),
                       "swiglu_alpha": (ALPHA, None)}
    ignored_hf_keys = frozenset({"output_router_logits"})
    mapped_hf_keys = (ModelFamily.mapped_hf_keys - {"mlp_bias"}) | {
        "sliding_window", "layer_types", "num_local_experts", "num_experts_per_tok", "swiglu_limit",
        "router_aux_loss_coef", "quantization_config"}

    # --------------------------------------------------------------------------------------------- config in
    def config_from_hf(self, hf: dict[str, Any]) -> ModelConfig:
        """The shared fields, then GPT-OSS's: sinks, window pattern, experts, the clamped quick-GeGLU, biases."""
        if hf.get("quantization_config") is not None:
            from megatron_bridge.families.gpt_oss.mxfp4 import check_quantization_config

            check_quantization_config(hf["quantization_config"])
        config = super().config_from_hf(hf)
        get = partial(self.hf_value, hf)
        window = get("sliding_window")
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise BridgeError(f"config.json sliding_window={window!r} must be a positive number of tokens")
        try:
            config.num_moe_experts = int(get("num_local_experts"))
            config.moe_router_topk = int(get("num_experts_per_tok"))
            config.activation_func_clamp_value = float(get("swiglu_limit"))
            config.moe_aux_loss_coeff = float(get("router_aux_loss_coef"))
        except (TypeError, ValueError) as exc:
            raise BridgeError(f"gpt_oss config.json has a bad field: {type(exc).__name__}: {exc}") from exc
        config.moe_ffn_hidden_size = config.ffn_hidden_size
        config.moe_router_score_function, config.moe_router_pre_softmax = "softmax", False
        config.moe_router_load_balancing_type = "aux_loss" if config.moe_aux_loss_coeff > 0 else "none"
        config.moe_layer_freq, config.moe_grouped_gemm = 1, True
        config.activation, config.glu_linear_offset = "quick_geglu", 1.0
        config.softmax_type = "learnable"
        config.add_qkv_bias, config.add_bias_linear, config.attention_output_bias = True, True, None
        config.window_size = (window - 1, 0)
        config.window_attn_skip_freq = [int(t == SLIDING) for t in _layer_types(hf, config.num_layers)]
        return config

    # -------------------------------------------------------------------------------------------- config out
    def matches(self, config: ModelConfig) -> bool:
        """GPT-OSS's layer: RMSNorm, sinks, biases, a window, every layer MoE with the clamped quick-GeGLU (offset 1)
        and softmax top-k routing over the k, no shared expert."""
        return (config.normalization == "RMSNorm" and config.activation == "quick_geglu"
                and config.glu_linear_offset == 1.0 and config.activation_func_clamp_value is not None
                and config.softmax_type == "learnable" and config.add_qkv_bias and config.add_bias_linear
                and config.has_attention_output_bias and not config.qk_layernorm
                and not config.multi_latent_attention and config.window_size is not None
                and config.window_size[1] == 0 and config.is_moe and all(config.moe_layer_pattern())
                and config.moe_router_score_function == "softmax" and not config.moe_router_pre_softmax
                and not config.moe_shared_expert_intermediate_size and not config.moe_router_enable_expert_bias
                and config.moe_router_topk_scaling_factor is None and config.moe_router_num_groups is None
                and not config.layernorm_zero_centered_gamma and not config.post_norms
                and config.rotary_base_local is None and config.softmax_scale is None)

    def config_to_hf(self, config: ModelConfig, *, rope_format: RopeFormat = "rope_parameters",
                     dtype: str = "float32") -> dict[str, Any]:
        """The shared keys (``intermediate_size`` the expert width, no ``hidden_act``), then GPT-OSS's."""
        if not self.matches(config):
            raise BridgeError(f"the model (activation={config.activation!r}, softmax_type={config.softmax_type!r}, "
                              f"window_size={config.window_size}, num_moe_experts={config.num_moe_experts}) is not a "
                              "gpt_oss model")
        out = {k: v for k, v in super().config_to_hf(config, rope_format=rope_format, dtype=dtype).items()
               if k != "hidden_act"}
        out["intermediate_size"] = config.expert_ffn_hidden_size
        return out

    def extra_hf_config(self, config: ModelConfig) -> dict[str, Any]:
        """Window, layer types, experts, the clamp."""
        window = config.window_size[0] + 1 if config.window_size is not None else None
        types = [SLIDING if config.attention_window(i) is not None else FULL for i in range(config.num_layers)]
        return {"sliding_window": window, "layer_types": types,
                "num_local_experts": config.num_moe_experts, "num_experts_per_tok": config.moe_router_topk,
                "swiglu_limit": config.activation_func_clamp_value, "swiglu_alpha": ALPHA,
                "router_aux_loss_coef": config.moe_aux_loss_coeff, "output_router_logits": False}

    # --------------------------------------------------------------------------------------------- weights
    def weight_names(self, config: ModelConfig) -> dict[str, str]:
        """1:1 names under ``model.`` (module docstring); gate and up are :meth:`interleaved_weights`."""
        names = {name: f"{HF_DECODER}.{name}" for name in (f"{n.EMBEDDING}.weight", f"{n.FINAL_NORM}.weight")}
        if not config.share_embeddings_and_output_weights:
            names[f"{n.OUTPUT}.weight"] = f"{n.OUTPUT}.weight"
        dense_mlp = f"{n.MLP}."
        for i in range(config.num_layers):
            inside = [p for p in n.dense_layer_parameters(config) if not p.startswith(dense_mlp)]
            inside += [f"{n.MLP}.{n.ROUTER}.weight", f"{n.MLP}.{n.ROUTER}.bias", f"{n.MLP}.{n.EXPERTS}.{n.DOWN}"]
            names.update({f"{n.layer(i)}.{p}": f"{HF_DECODER}.{n.layer(i)}.{p}" for p in inside})
            experts = f"{n.mlp(i)}.{n.EXPERTS}"
            names[f"{experts}.down_bias"] = f"{HF_DECODER}.{experts}.down_proj_bias"
        return names

    def interleaved_weights(self, config: ModelConfig) -> dict[str, InterleavedWeight]:
        """Gate (even columns) and up (odd columns) of ``gate_up_proj`` and ``gate_up_proj_bias``."""
        out = {}
        for i in range(config.num_layers):
            experts = f"{n.mlp(i)}.{n.EXPERTS}"
            hf = f"{HF_DECODER}.{experts}.gate_up_proj"
            out[f"{experts}.{n.GATE}"], out[f"{experts}.{n.UP}"] = InterleavedWeight(hf, 0), InterleavedWeight(hf, 1)
            out[f"{experts}.gate_bias"] = InterleavedWeight(f"{hf}_bias", 0)
            out[f"{experts}.up_bias"] = InterleavedWeight(f"{hf}_bias", 1)
        return out


    def read_hf_tensor(self, reader: Any, name: str) -> Any:
        """The stored tensor; an MXFP4 expert tensor (``name_blocks`` and ``name_scales``) dequantized to float32."""
        from megatron_bridge.families.gpt_oss.mxfp4 import read_dequantized

        return read_dequantized(reader, name)

    def read_hf_shapes(self, reader: Any) -> dict[str, tuple[int, ...]]:
        """The stored shapes, each MXFP4 ``name_blocks``/``name_scales`` pair as ``name`` dequantized."""
        from megatron_bridge.families.gpt_oss.mxfp4 import logical_shapes

        return logical_shapes(reader.shapes())


def _layer_types(hf: dict[str, Any], num_layers: int) -> list[str]:
    """``layer_types``, or transformers' default: sliding on even layers, full on odd ones."""
    types = hf.get("layer_types")
    if types is None:
        types = [SLIDING if (i + 1) % 2 else FULL for i in range(num_layers)]
    if len(types) != num_layers or any(t not in (SLIDING, FULL) for t in types):
        raise BridgeError(f"config.json layer_types={types!r} must give {num_layers} entries, each {SLIDING!r} or "
                          f"{FULL!r}")
    return list(types)
