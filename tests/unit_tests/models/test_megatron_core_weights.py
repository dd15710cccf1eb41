"""Weights between the engines (megatron_bridge.engines.megatron_core.weights): names, the fused QKV and gate/up
layouts,
and exact round trips. Pure tensor code: runs without megatron-core."""

from fnmatch import fnmatchcase

import pytest
import torch

from megatron_bridge.engines.megatron_core.weights import megatron_core_to_native, native_to_megatron_core, weight_rules
from megatron_bridge.models.llama import LlamaModel
from megatron_bridge.recipes import tiny_llama_pretrain_config


MOE = {"qk_layernorm": True, "num_moe_experts": 4, "moe_ffn_hidden_size": 16, "moe_shared_expert_intermediate_size": 8,
       "moe_router_enable_expert_bias": True, "moe_router_score_function": "sigmoid", "moe_layer_freq": [0, 1]}
"""An MoE model with a dense first layer, a shared expert and the expert bias (buffer)."""


def _model_config(**fields: object):  # noqa: ANN202
    m = tiny_llama_pretrain_config().model
    m.num_layers = 2
    for k, v in fields.items():
        setattr(m, k, v)
    return m


@pytest.mark.parametrize("fields", [
    {},
    {"qk_layernorm": True, "share_embeddings_and_output_weights": True},
    {"add_bias_linear": True, "add_qkv_bias": True, "activation": "gelu", "normalization": "LayerNorm"},
    MOE,
], ids=["llama", "qwen3_tied", "gpt_biases", "moe_shared_expert_bias"])
def test_round_trip_is_exact(fields: dict) -> None:
    m = _model_config(**fields)
    torch.manual_seed(0)
    native = LlamaModel(m).state_dict()
    mcore = native_to_megatron_core(native, m)
    assert ("output_layer.weight" in mcore) == (not m.share_embeddings_and_output_weights)
    assert all(k.startswith(("embedding.", "decoder.", "output_layer.")) for k in mcore)
    back = megatron_core_to_native(mcore, m)
    assert sorted(back) == sorted(native)
    for k, v in native.items():
        assert torch.equal(back[k], v), k


def test_fused_layouts() -> None:
    """QKV rows per query group: [q heads of group 0, k0, v0, q heads of group 1, k1, v1]; fc1 = [gate; up]."""
    m = _model_config(num_attention_heads=4, num_query_groups=2, hidden_size=8, ffn_hidden_size=6)
    d = m.head_dim  # 2
    rows = {name: torch.full((n * d, 8), float(i)) for i, (name, n) in enumerate([("q", 4), ("k", 2), ("v", 2)])}
    for name in rows:  # mark each head
        rows[name] += torch.arange(rows[name].shape[0]).div(d, rounding_mode="floor")[:, None] * 10
    state = {"layers.0.self_attn.q_proj.weight": rows["q"], "layers.0.self_attn.k_proj.weight": rows["k"],
             "layers.0.self_attn.v_proj.weight": rows["v"],
             "layers.0.mlp.gate_proj.weight": torch.zeros(6, 8), "layers.0.mlp.up_proj.weight": torch.ones(6, 8)}
    m.num_layers = 1
    out = native_to_megatron_core(state, m)
    qkv = out["decoder.layers.0.self_attention.linear_qkv.weight"][:, 0].reshape(-1, d)[:, 0].tolist()
    # (kind index + 10 × head index): group 0 = q0, q1, k0, v0; group 1 = q2, q3, k1, v1
    assert qkv == [0.0, 10.0, 1.0, 2.0, 20.0, 30.0, 11.0, 12.0]
    fc1 = out["decoder.layers.0.mlp.linear_fc1.weight"]
    assert fc1.shape == (12, 8) and fc1[:6].eq(0).all() and fc1[6:].eq(1).all()


@pytest.mark.parametrize("fields", [
    {"qk_layernorm": True, "add_bias_linear": True, "add_qkv_bias": True},
    {"activation": "gelu", "normalization": "LayerNorm", "add_bias_linear": True},
], ids=["swiglu", "gelu"])
def test_table_names_every_parameter_once(fields: dict) -> None:
    """The declarative table (wildcard patterns) covers every parameter of the native model and of its megatron-core
    image exactly once."""
    m = _model_config(**fields)
    rules = weight_rules(m)
    native = LlamaModel(m, device="meta").state_dict()
    for name in native:
        assert sum(fnmatchcase(name, p) for r in rules for p in r.native) == 1, name
    for name in native_to_megatron_core(native, m):
        assert sum(fnmatchcase(name, r.mcore) for r in rules) == 1, name



def test_moe_layouts_are_megatron_cores() -> None:
    """Per MoE layer: the router and its expert bias as they are; expert e's ``linear_fc1`` = [gate[e]ᵀ; up[e]ᵀ]
    and ``linear_fc2`` = down[e]ᵀ (the native experts are stacked ``x @ W``, megatron-core's ``SequentialMLP``
    experts are ``nn.Linear``-shaped); the shared expert's fc1 = [gate; up]; the dense first layer keeps its MLP."""
    m = _model_config(**MOE)
    torch.manual_seed(0)
    native = LlamaModel(m).state_dict()
    mcore = native_to_megatron_core(native, m)
    experts = "layers.1.mlp.experts."
    for e in range(4):
        fc1 = mcore[f"decoder.layers.1.mlp.experts.local_experts.{e}.linear_fc1.weight"]
        assert fc1.shape == (32, m.hidden_size)
        assert torch.equal(fc1[:16], native[experts + "gate_proj"][e].t())
        assert torch.equal(fc1[16:], native[experts + "up_proj"][e].t())
        assert torch.equal(mcore[f"decoder.layers.1.mlp.experts.local_experts.{e}.linear_fc2.weight"],
                           native[experts + "down_proj"][e].t())
    assert torch.equal(mcore["decoder.layers.1.mlp.router.weight"], native["layers.1.mlp.router.weight"])
    assert "decoder.layers.1.mlp.router.expert_bias" in mcore
    shared = mcore["decoder.layers.1.mlp.shared_experts.linear_fc1.weight"]
    assert torch.equal(shared[:8], native["layers.1.mlp.shared_experts.gate_proj.weight"])
    assert "decoder.layers.0.mlp.linear_fc1.weight" in mcore and not any(k.startswith("decoder.layers.0.mlp.router")
                                                                         for k in mcore)
