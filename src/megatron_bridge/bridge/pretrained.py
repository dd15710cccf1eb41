"""Training from a HF folder: ``checkpoint.pretrained_checkpoint`` pointing at one is checked against ``cfg.model``
(the first field that differs is named, before any tensor is read) and read lazily under our names."""

import math
from pathlib import Path
from typing import Any

import torch

from megatron_bridge.bridge.families import family_for_hf_config
from megatron_bridge.bridge.hf_reader import CONFIG_FILENAME, HFWeightsReader, read_json
from megatron_bridge.bridge.weights import HFModelWeights
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError


ARCHITECTURE_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("num_layers", "num_layers", "num_hidden_layers"),
    ("hidden_size", "hidden_size", "hidden_size"),
    ("ffn_hidden_size", "ffn_hidden_size", "intermediate_size"),
    ("num_attention_heads", "num_attention_heads", "num_attention_heads"),
    ("num_query_groups", "num_kv_heads", "num_key_value_heads"),
    ("kv_channels", "head_dim", "head_dim"),
    ("vocab_size", "vocab_size", "vocab_size"),
    ("normalization", "normalization", "architectures"),
    ("activation", "activation", "hidden_act"),
    ("qk_layernorm", "qk_layernorm", "architectures"),
    ("layernorm_epsilon", "layernorm_epsilon", "rms_norm_eps"),
    ("rotary_base", "rotary_base", "rope_theta"),
    ("rope_scaling", "rope_scaling", "rope_type"),
    ("rope_scaling_factor", "rope_scaling_factor", "factor"),
    ("rope_low_freq_factor", "rope_low_freq_factor", "low_freq_factor"),
    ("rope_high_freq_factor", "rope_high_freq_factor", "high_freq_factor"),
    ("rope_original_max_position_embeddings", "rope_original_max_position_embeddings",
     "original_max_position_embeddings"),
    ("add_qkv_bias", "add_qkv_bias", "attention_bias"),
    ("attention_output_bias", "has_attention_output_bias", "attention_bias"),
    ("add_bias_linear", "add_bias_linear", "mlp_bias"),
    ("share_embeddings_and_output_weights", "share_embeddings_and_output_weights", "tie_word_embeddings"),
    ("num_moe_experts", "num_moe_experts", "num_experts"),
    ("moe_ffn_hidden_size", "expert_ffn_hidden_size", "moe_intermediate_size"),
    ("moe_router_topk", "moe_router_topk", "num_experts_per_tok"),
    ("moe_router_pre_softmax", "moe_router_pre_softmax", "norm_topk_prob"),
    ("window_size", "window_size", "sliding_window"),
    ("position_embedding_type", "position_embedding_type", "rope_type"),
    ("yarn_rotary_scaling_factor", "yarn_rotary_scaling_factor", "factor"),
    ("yarn_original_max_position_embeddings", "yarn_original_max_position_embeddings",
     "original_max_position_embeddings"),
    ("yarn_beta_fast", "yarn_beta_fast", "beta_fast"),
    ("yarn_beta_slow", "yarn_beta_slow", "beta_slow"),
    ("yarn_mscale", "yarn_mscale", "mscale"),
    ("yarn_mscale_all_dim", "yarn_mscale_all_dim", "mscale_all_dim"),
    ("yarn_correction_range_round_to_int", "yarn_correction_range_round_to_int", "truncate"),
)
"""(ModelConfig field, attribute compared, HF key) for every setting that changes the weights' meaning."""
_ROPE_SCALING_FIELDS = {"rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                        "rope_original_max_position_embeddings"}
_YARN_FIELDS = {"yarn_rotary_scaling_factor", "yarn_original_max_position_embeddings", "yarn_beta_fast",
                "yarn_beta_slow", "yarn_mscale", "yarn_mscale_all_dim", "yarn_correction_range_round_to_int"}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):  # window_size: a tuple, or a list from Python
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


def first_mismatch(model: ModelConfig, hf_model: ModelConfig) -> tuple[str, Any, Any, str] | None:
    """(field, model value, HF value, HF key) of the first architecture field that differs, else None."""
    for field, attr, hf_key in ARCHITECTURE_FIELDS:
        if field in _ROPE_SCALING_FIELDS and not (model.rope_scaling and hf_model.rope_scaling):
            continue
        if field in _YARN_FIELDS and not model.position_embedding_type == hf_model.position_embedding_type == "yarn":
            continue
        mine, theirs = getattr(model, attr), getattr(hf_model, attr)
        if not _same(mine, theirs):
            return field, mine, theirs, hf_key
    return None


def check_hf_matches_model(folder: str | Path, model: ModelConfig, what: str = "checkpoint.pretrained_checkpoint"
                           ) -> ModelConfig:
    """BridgeError naming the first field where ``folder``'s config.json and ``model`` differ; returns the HF
    folder's model config."""
    hf = read_json(Path(folder) / CONFIG_FILENAME, "config")
    hf_model = family_for_hf_config(hf).config_from_hf(hf)
    diff = first_mismatch(model, hf_model)
    if diff is not None:
        field, mine, theirs, hf_key = diff
        raise BridgeError(f"{what}={str(folder)!r} does not fit cfg.model: model.{field}={mine!r} but the folder's "
                          f"config.json says {theirs!r} ({hf_key}); set model.{field}={theirs!r} or build cfg.model "
                          "with AutoBridge.from_hf_pretrained(path).to_megatron_provider()")
    return hf_model


def hf_weights_for_model(folder: str | Path, model: ModelConfig, dtype: torch.dtype | None = None) -> HFModelWeights:
    """The HF folder's weights for ``model`` (config checked first), read lazily, vocabulary padded for ``model``."""
    check_hf_matches_model(folder, model)
    family = family_for_hf_config(read_json(Path(folder) / CONFIG_FILENAME, "config"))
    if not family.matches(model):
        raise BridgeError(f"the {family.name} folder {str(folder)!r} cannot load into this model")
    return HFModelWeights(HFWeightsReader(folder), family, model, dtype)

