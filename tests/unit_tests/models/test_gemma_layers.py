"""Gemma's pieces of the shared decoder against transformers' Gemma 3 modules: the zero-centred RMSNorm
(``model.layernorm_zero_centered_gamma``), the GeGLU MLP (``activation="geglu"``), the scaled embedding; the
megatron-core engine refuses them by name (rule ``megatron_core_features``)."""

import pytest
import torch

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.models.layers import RMSNorm
from megatron_bridge.models.llama import LlamaMLP, LlamaModel
from megatron_bridge.recipes import get_recipe


def test_zero_centred_rms_norm_equals_gemma3s() -> None:
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    torch.manual_seed(0)
    hf = Gemma3RMSNorm(32, eps=1e-6)
    ours = RMSNorm(32, 1e-6, zero_centered=True)
    assert torch.equal(ours.weight, hf.weight)  # both start at zero: scale 1
    with torch.no_grad():
        hf.weight.normal_()
        ours.weight.copy_(hf.weight)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(3, 5, 32).to(dtype)
        assert torch.equal(ours(x), hf(x)), dtype


def test_geglu_mlp_equals_gemma3s() -> None:
    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3MLP

    torch.manual_seed(0)
    hf = Gemma3MLP(Gemma3TextConfig(hidden_size=32, intermediate_size=48))
    ours = LlamaMLP(ModelConfig(hidden_size=32, ffn_hidden_size=48, activation="geglu"), dtype=torch.float32)
    ours.to_empty(device="cpu")
    ours.load_state_dict(hf.state_dict())
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(ours(x), hf(x), atol=1e-6, rtol=0)


def test_embedding_is_scaled_by_sqrt_hidden_in_the_model_dtype() -> None:
    """bf16 weights: the factor is rounded to bf16 first (sqrt(128) = 11.3137... → 11.3125), as transformers does."""
    cfg = get_recipe("tiny_gemma3").fn().model
    cfg.num_layers, cfg.params_dtype, cfg.window_attn_skip_freq = 1, "bfloat16", None
    torch.manual_seed(0)
    model = LlamaModel(cfg)
    seen = {}
    model.layers[0].register_forward_pre_hook(lambda _, args: seen.update(x=args[0]))
    tokens = torch.randint(0, 258, (1, 5))
    model(tokens)
    want = model.embed_tokens(tokens) * torch.tensor(128**0.5).to(torch.bfloat16)
    assert torch.equal(seen["x"], want)


@pytest.mark.support_cells("gemma3:megatron_core!megatron_core_features")
def test_megatron_core_engine_refuses_gemmas_pieces_by_name() -> None:
    cfg = get_recipe("tiny_gemma3").fn()
    cfg.model.engine = "megatron_core"
    with pytest.raises(ConfigValidationError, match=r"\[rule megatron_core_features\]") as err:
        cfg.validate(world_size=1)
    for field in ("rotary_base_local", "layernorm_zero_centered_gamma", "post_norms",
                  "scale_embeddings_by_sqrt_hidden"):
        assert f"model.{field}" in str(err.value)
