"""The DeepSeek-V2 mapping's config side: DeepSeek-V2-Lite's published config.json imports to the
``deepseek_v2_lite`` recipe's model, the recipes map to a transformers ``DeepseekV2Config`` and back unchanged, and
a router transformers' V2 does not have is refused by name. (Weights and logits: test_parity.py's deepseek-v2
variants.)"""

import logging
import warnings

import pytest

from megatron_bridge import AutoBridge
from megatron_bridge.bridge.families import family_for_hf_config, family_for_model_config
from megatron_bridge.bridge.pretrained import first_mismatch
from megatron_bridge.errors import BridgeError
from megatron_bridge.recipes import RECIPES


V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV2Config"}, "aux_loss_alpha": 0.001,
    "bos_token_id": 100000, "eos_token_id": 100001, "ep_size": 1, "first_k_dense_replace": 1, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1408,
    "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": False,
    "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "pretraining_tp": 1, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 102400,
}
"""deepseek-ai/DeepSeek-V2-Lite's config.json (its remote-code keys included)."""
TRAINING_FIELDS = {"seq_length", "expert_model_parallel_size", "attention_output_bias"}
"""Fields the recipe sets for training (or leaves to the bias default) that a config.json does not say."""


def test_v2_lite_config_json_imports_to_the_recipe_model() -> None:
    family = family_for_hf_config(V2_LITE)
    imported = family.config_from_hf(V2_LITE)
    recipe = RECIPES["deepseek_v2_lite"].fn().model
    assert family.name == "deepseek_v2" and first_mismatch(recipe, imported) is None
    differ = {f for f in imported.__dataclass_fields__ if getattr(imported, f) != getattr(recipe, f)}
    assert differ == TRAINING_FIELDS, differ
    assert (imported.moe_router_score_function, imported.moe_router_pre_softmax, imported.moe_router_num_groups,
            imported.moe_router_enable_expert_bias, imported.moe_aux_loss_coeff) == ("softmax", True, None, False, 1e-3)


@pytest.mark.parametrize("recipe", ["deepseek_v2_lite", "tiny_deepseek_v2"])
def test_recipes_map_to_transformers_and_back(recipe, caplog) -> None:  # noqa: ANN001
    from transformers import AutoConfig

    model = RECIPES[recipe].fn().model
    family = family_for_model_config(model)
    assert family.name == "deepseek_v2"
    hf = family.config_to_hf(model)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        loaded = AutoConfig.for_model(**hf)
    assert not [r.getMessage() for r in caplog.records]
    assert not [w for w in caught if "transformers" in str(w.filename)]
    assert type(loaded).__name__ == "DeepseekV2Config" and loaded.topk_method == "greedy"
    assert first_mismatch(model, AutoBridge.from_hf_config(loaded).to_megatron_provider(load_weights=False)) is None


def test_an_unknown_router_is_named() -> None:
    with pytest.raises(BridgeError, match="topk_method='noaux_tc'"):
        family_for_hf_config(V2_LITE).config_from_hf({**V2_LITE, "topk_method": "noaux_tc"})
    with pytest.raises(BridgeError, match="scoring_func"):
        family_for_hf_config(V2_LITE).config_from_hf({**V2_LITE, "scoring_func": "sigmoid"})
