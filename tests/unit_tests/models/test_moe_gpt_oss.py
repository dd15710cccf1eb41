"""GPT-OSS's MoE pieces against transformers' ``GptOssMLP`` (router with a bias, top-k of the logits then softmax
over the k; experts with interleaved gate/up, biases, the clamped quick-GeGLU with the +1 offset), forward and
backward, on weights large enough that the clamp (7) acts on many units.

Tolerance (float32): outputs and gradients within 1e-5 absolute of transformers."""

import pytest
import torch

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError, ConfigValidationError
from megatron_bridge.models.llama import LlamaMLP, _linear
from megatron_bridge.models.moe import MoELayer, quick_gelu
from megatron_bridge.recipes import get_recipe


transformers = pytest.importorskip("transformers")
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP  # noqa: E402


ATOL = 1e-5
H, E, F_, K = 16, 4, 8, 2


def gpt_oss_moe_config(**overrides: object) -> ModelConfig:
    base: dict[str, object] = {
        "num_layers": 2, "hidden_size": H, "ffn_hidden_size": F_, "num_attention_heads": 2, "num_moe_experts": E,
        "moe_ffn_hidden_size": F_, "moe_router_topk": K, "activation": "quick_geglu", "glu_linear_offset": 1.0,
        "activation_func_clamp_value": 7.0, "add_bias_linear": True, "moe_aux_loss_coeff": 0.0}
    base.update(overrides)
    return ModelConfig(**base)  # type: ignore[arg-type]


def pair(seed: int = 0) -> tuple[MoELayer, GptOssMLP]:
    """Our layer and transformers' with the same random weights (HF's gate_up interleaved: gate even columns)."""
    torch.manual_seed(seed)
    ours = MoELayer(gpt_oss_moe_config(), dtype=torch.float32, linear=_linear)
    ours.to_empty(device="cpu")
    hf_cfg = transformers.GptOssConfig(hidden_size=H, intermediate_size=F_, num_local_experts=E,
                                       num_experts_per_tok=K, num_hidden_layers=2, num_attention_heads=2,
                                       num_key_value_heads=1, head_dim=8)
    hf = GptOssMLP(hf_cfg).float()
    with torch.no_grad():
        for p in (ours.router.weight, ours.router.bias, ours.experts.gate_bias, ours.experts.up_bias,
                  ours.experts.down_bias):
            p.normal_(0.0, 1.0)
        for p in (ours.experts.gate_proj, ours.experts.up_proj):
            p.normal_(0.0, 1.5)
        ours.experts.down_proj.normal_(0.0, 0.02)  # outputs of order 1: the tolerance is absolute
        hf.router.weight.copy_(ours.router.weight)
        hf.router.bias.copy_(ours.router.bias)
        ex = hf.experts
        ex.gate_up_proj[..., ::2] = ours.experts.gate_proj
        ex.gate_up_proj[..., 1::2] = ours.experts.up_proj
        ex.gate_up_proj_bias[..., ::2] = ours.experts.gate_bias
        ex.gate_up_proj_bias[..., 1::2] = ours.experts.up_bias
        ex.down_proj.copy_(ours.experts.down_proj)
        ex.down_proj_bias.copy_(ours.experts.down_bias)
    return ours, hf


def test_forward_and_backward_match_transformers_gpt_oss_mlp() -> None:
    ours, hf = pair()
    x = torch.randn(2, 7, H) * 2.0
    x_ours, x_hf = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours = ours(x_ours)
    y_hf, _ = hf(x_hf)
    gate = x.reshape(-1, H) @ ours.experts.gate_proj[0]
    assert (gate > 7.0).any() and (gate < -7.0).any()  # the clamp acts
    torch.testing.assert_close(y_ours, y_hf, atol=ATOL, rtol=0)
    y_ours.square().sum().backward()
    y_hf.square().sum().backward()
    torch.testing.assert_close(x_ours.grad, x_hf.grad, atol=ATOL, rtol=0)
    torch.testing.assert_close(ours.router.bias.grad, hf.router.bias.grad, atol=ATOL, rtol=0)
    torch.testing.assert_close(ours.experts.down_bias.grad, hf.experts.down_proj_bias.grad, atol=ATOL, rtol=0)
    torch.testing.assert_close(ours.experts.gate_bias.grad, hf.experts.gate_up_proj_bias.grad[..., ::2],
                               atol=ATOL, rtol=0)
    torch.testing.assert_close(ours.experts.up_proj.grad, hf.experts.gate_up_proj.grad[..., 1::2], atol=ATOL, rtol=0)


def test_defaults_keep_plain_swiglu_without_biases() -> None:
    layer = MoELayer(ModelConfig(num_layers=1, hidden_size=H, ffn_hidden_size=F_, num_attention_heads=2,
                                 num_moe_experts=E), dtype=torch.float32, linear=_linear)
    names = {n for n, _ in layer.named_parameters()}
    assert names == {"router.weight", "experts.gate_proj", "experts.up_proj", "experts.down_proj"}


def test_biases_reset_to_zero() -> None:
    ours, _ = pair()
    ours.router.reset_parameters(0.02)
    ours.experts.reset_parameters(0.02, 0.01)
    for b in (ours.router.bias, ours.experts.gate_bias, ours.experts.up_bias, ours.experts.down_bias):
        assert b is not None and not b.any()


def test_dense_mlp_quick_geglu() -> None:
    mlp = LlamaMLP(ModelConfig(num_layers=1, hidden_size=H, ffn_hidden_size=F_, num_attention_heads=2,
                               activation="quick_geglu"), dtype=torch.float32)
    mlp.to_empty(device="cpu")
    for lin in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
        torch.nn.init.normal_(lin.weight)
    x = torch.randn(3, H)
    g = x @ mlp.gate_proj.weight.T
    want = (g * torch.sigmoid(1.702 * g) * (x @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
    torch.testing.assert_close(mlp(x), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(quick_gelu(torch.tensor([1.0])), torch.sigmoid(torch.tensor([1.702])))


@pytest.mark.support_cells("gpt_oss:megatron_core!megatron_core_features")
def test_megatron_core_engine_refuses_gpt_oss_pieces_by_name() -> None:
    cfg = get_recipe("tiny_gpt_oss").fn(expert_model_parallel_size=1)
    cfg.model.engine = "megatron_core"
    with pytest.raises(ConfigValidationError, match=r"\[rule megatron_core_features\]") as err:
        cfg.validate(world_size=1)
    for field in ("activation", "glu_linear_offset", "activation_func_clamp_value", "add_bias_linear",
                  "softmax_type"):
        assert f"model.{field}" in str(err.value)


def test_mxfp4_config_is_read_and_other_quantizations_are_refused_by_name() -> None:
    """MXFP4 folders import (dequantized: tests/unit_tests/bridge/test_gpt_oss_mxfp4.py); another method is named."""
    from megatron_bridge.bridge.families.base import family_by_name

    hf = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 32,
          "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 64,
          "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": []}}
    assert family_by_name("gpt_oss").config_from_hf(hf).num_moe_experts == 128
    with pytest.raises(BridgeError, match="quant_method='bitsandbytes'.*only the MXFP4"):
        family_by_name("gpt_oss").config_from_hf({**hf, "quantization_config": {"quant_method": "bitsandbytes"}})


def test_tiny_gpt_oss_config_round_trips_through_the_bridge() -> None:
    from megatron_bridge.bridge.families.base import family_by_name

    family = family_by_name("gpt_oss")
    model = get_recipe("tiny_gpt_oss").fn().model
    back = family.config_from_hf(family.config_to_hf(model))
    for field in ("window_size", "activation", "glu_linear_offset", "activation_func_clamp_value", "softmax_type",
                  "num_moe_experts", "moe_router_topk", "expert_ffn_hidden_size", "yarn_rotary_scaling_factor",
                  "yarn_original_max_position_embeddings", "add_bias_linear", "add_qkv_bias"):
        assert getattr(back, field) == getattr(model, field), field
    assert [back.attention_window(i) for i in range(4)] == [32, None, 32, None]
