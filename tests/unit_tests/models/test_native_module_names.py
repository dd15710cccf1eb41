"""``config/decoder_names.native_module_names`` (torch-free, for rule ``tp_plan_matches_model``) lists exactly the
modules of the native ``LlamaModel`` built from the same config, in the same order."""

import pytest
from tests.unit_tests.models.configs import tiny

from megatron_bridge.config.decoder_names import native_module_names
from megatron_bridge.models.llama import LlamaModel
from megatron_bridge.recipes import get_recipe


@pytest.mark.parametrize("recipe", ["tiny_llama", "tiny_moe", "qwen3_600m", "tiny_gemma3"])
def test_names_of_recipe_models(recipe: str) -> None:
    model = get_recipe(recipe).fn().model
    model.num_layers = 2
    assert native_module_names(model) == [n for n, _ in LlamaModel(model, device="meta").named_modules()]


@pytest.mark.parametrize("changes", [
    {"activation": "gelu"},
    {"qk_layernorm": True, "share_embeddings_and_output_weights": True},
    {"num_moe_experts": 4, "moe_router_topk": 2, "moe_shared_expert_intermediate_size": 32, "moe_layer_freq": 2},
    {"multi_latent_attention": True, "q_lora_rank": 16, "kv_lora_rank": 8, "qk_head_dim": 8,
     "qk_pos_emb_head_dim": 4, "v_head_dim": 8},
    {"multi_latent_attention": True, "q_lora_rank": None, "kv_lora_rank": 8, "qk_head_dim": 8,
     "qk_pos_emb_head_dim": 4, "v_head_dim": 8},
])
def test_names_follow_the_config(changes: dict) -> None:
    model = tiny(**changes)
    names = native_module_names(model)
    assert names == [n for n, _ in LlamaModel(model, device="meta").named_modules()]
    assert ("layers.0.mlp.gate_proj" in names) == (model.activation == "swiglu" and not model.moe_layer_pattern()[0])
