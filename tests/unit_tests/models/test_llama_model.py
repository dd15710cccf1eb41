"""Unit tests of the local Llama decoder: shapes, attention, RoPE, dtypes, init and CPU offloading."""

import math
from dataclasses import replace

import pytest
import torch
from tests.unit_tests.models.configs import tiny as shared_tiny
from torch.nn import functional as F

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import ConfigValidationError, MegatronBridgeError
from megatron_bridge.models.layers import RMSNorm, apply_rotary_pos_emb, rope_inv_freq
from megatron_bridge.models.llama import LlamaModel


def tiny(**overrides: object) -> ModelConfig:
    """The shared tiny config with plain multi-head attention (one KV head per query head)."""
    return shared_tiny(**{"num_query_groups": None, **overrides})


def build(config: ModelConfig, seed: int = 0) -> LlamaModel:
    torch.manual_seed(seed)
    return LlamaModel(config)


def tokens(config: ModelConfig, b: int = 2, s: int = 12, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (b, s), generator=g)


def test_shapes_and_names() -> None:
    cfg = tiny(num_query_groups=2)
    model = build(cfg)
    ids = tokens(cfg)
    logits = model(ids)
    assert logits.shape == (2, 12, cfg.padded_vocab_size) == (2, 12, 112)
    loss = model(ids, labels=ids)
    assert loss.shape == (2, 12) and loss.dtype == torch.float32
    names = set(dict(model.named_parameters()))
    for name in [
        "embed_tokens.weight",
        "layers.0.input_layernorm.weight",
        "layers.0.self_attn.q_proj.weight",
        "layers.0.self_attn.k_proj.weight",
        "layers.1.self_attn.v_proj.weight",
        "layers.1.self_attn.o_proj.weight",
        "layers.1.post_attention_layernorm.weight",
        "layers.1.mlp.gate_proj.weight",
        "layers.1.mlp.up_proj.weight",
        "layers.1.mlp.down_proj.weight",
        "norm.weight",
        "lm_head.weight",
    ]:
        assert name in names
    assert model.layers[0].self_attn.k_proj.weight.shape == (2 * 8, 32)
    assert LlamaModel._no_split_modules == ["LlamaDecoderLayer"]
    assert "rotary_emb.inv_freq" not in model.state_dict()


def test_variants_biases_gelu_layernorm_qk_norm() -> None:
    cfg = tiny(
        activation="gelu", normalization="LayerNorm", add_bias_linear=True, add_qkv_bias=True, qk_layernorm=True
    )
    model = build(cfg)
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    assert mlp.gate_proj is None and mlp.up_proj.bias is not None and attn.o_proj.bias is not None
    assert attn.q_proj.bias is not None and attn.q_norm is not None and attn.k_norm is not None
    assert model.layers[0].input_layernorm.bias is not None
    assert model(tokens(cfg)).isfinite().all()
    plain = build(tiny())
    assert plain.layers[0].self_attn.q_proj.bias is None and plain.layers[0].self_attn.q_norm is None


def test_loss_equals_cross_entropy_on_logits() -> None:
    cfg = tiny()
    model = build(cfg)
    ids = tokens(cfg)
    labels = torch.roll(ids, -1, dims=1)
    labels[0, -1] = -100
    loss = model(ids, labels=labels)
    logits = model(ids)
    expected = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    torch.testing.assert_close(loss, expected.view(2, 12), rtol=0, atol=0)
    assert loss[0, -1] == 0


def test_bad_input_shapes_raise() -> None:
    cfg = tiny()
    model = build(cfg)
    with pytest.raises(MegatronBridgeError, match="input_ids"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(MegatronBridgeError, match="labels"):
        model(tokens(cfg), labels=torch.zeros(2, 3, dtype=torch.long))


def test_causal() -> None:
    cfg = tiny()
    model = build(cfg)
    ids = tokens(cfg)
    changed = ids.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % cfg.vocab_size
    torch.testing.assert_close(model(ids)[:, :8], model(changed)[:, :8])
    assert not torch.allclose(model(ids)[:, 8:], model(changed)[:, 8:])


def test_gqa_equals_mha_with_repeated_kv_heads() -> None:
    gqa_cfg = tiny(num_query_groups=2)
    gqa = build(gqa_cfg)
    mha = build(tiny())
    state = gqa.state_dict()
    group = gqa_cfg.num_attention_heads // gqa_cfg.num_kv_heads
    for i in range(gqa_cfg.num_layers):
        for proj in ("k_proj", "v_proj"):
            key = f"layers.{i}.self_attn.{proj}.weight"
            w = state[key].view(gqa_cfg.num_kv_heads, gqa_cfg.head_dim, -1)
            state[key] = w.repeat_interleave(group, dim=0).reshape(-1, gqa_cfg.hidden_size)
    mha.load_state_dict(state)
    ids = tokens(gqa_cfg)
    torch.testing.assert_close(gqa(ids), mha(ids), rtol=1e-5, atol=1e-5)
    # num_query_groups == num_attention_heads is plain MHA, bit for bit.
    explicit = build(tiny(num_query_groups=4))
    torch.testing.assert_close(explicit(ids), build(tiny())(ids), rtol=0, atol=0)


def test_tied_embeddings_share_storage() -> None:
    cfg = tiny(share_embeddings_and_output_weights=True)
    model = build(cfg)
    assert model.lm_head is None
    assert model.output_weight.data_ptr() == model.embed_tokens.weight.data_ptr()
    assert "lm_head.weight" not in model.state_dict()
    model(tokens(cfg), labels=tokens(cfg, seed=2)).mean().backward()
    assert model.embed_tokens.weight.grad is not None
    untied = build(tiny())
    assert untied.output_weight.data_ptr() != untied.embed_tokens.weight.data_ptr()


def test_position_ids_default_and_relative_invariance() -> None:
    cfg = tiny()
    model = build(cfg)
    ids = tokens(cfg)
    default = model(ids)
    torch.testing.assert_close(model(ids, position_ids=torch.arange(12).expand(2, 12)), default, rtol=0, atol=0)
    # RoPE encodes relative positions only: shifting every position by a constant changes nothing (up to rounding).
    torch.testing.assert_close(
        model(ids, position_ids=torch.arange(12).unsqueeze(0) + 5), default, rtol=1e-4, atol=1e-4
    )


def test_rope_frequencies_plain_and_llama31_scaling() -> None:
    cfg = tiny(hidden_size=128, num_attention_heads=1, rotary_base=500000.0)
    plain = rope_inv_freq(cfg)
    assert plain.dtype == torch.float32 and plain.shape == (64,)
    assert plain[0].item() == 1.0
    assert math.isclose(plain[10].item(), 500000.0 ** (-20 / 128), rel_tol=1e-6)

    scaled = rope_inv_freq(replace(cfg, rope_scaling=True))  # factor 8, low 1, high 4, original length 8192
    # Wavelength 2*pi/f below 8192/4 = 2048: unchanged (index 28: 2*pi*500000**(56/128) ~ 1952).
    for i in (0, 10, 28):
        assert scaled[i].item() == plain[i].item()
    # Wavelength above 8192/1: divided by 8 (index 35: ~ 2*pi*500000**(70/128) ~ 8785).
    for i in (35, 50, 63):
        assert math.isclose(scaled[i].item(), 500000.0 ** (-2 * i / 128) / 8, rel_tol=1e-6)
    # In between, interpolated: smooth = (8192 / wavelength - 1) / (4 - 1).
    for i in (29, 32, 34):
        f = 500000.0 ** (-2 * i / 128)
        smooth = (8192 / (2 * math.pi / f) - 1) / 3
        assert 0 < smooth < 1
        assert math.isclose(scaled[i].item(), (1 - smooth) * f / 8 + smooth * f, rel_tol=1e-6)
    model = build(replace(cfg, rope_scaling=True, num_layers=1))
    torch.testing.assert_close(model.rotary_emb.inv_freq, scaled, rtol=0, atol=0)


def test_rope_rotation_matches_complex_multiplication() -> None:
    x = torch.randn(1, 1, 3, 4)
    cfg = tiny(hidden_size=16)  # head_dim 4
    cos, sin = build(cfg).rotary_emb(torch.arange(3).unsqueeze(0))
    out = apply_rotary_pos_emb(x, cos, sin)
    freqs = rope_inv_freq(cfg)
    z = torch.complex(x[..., :2], x[..., 2:]) * torch.polar(torch.ones(3, 2), torch.arange(3.0)[:, None] * freqs)
    torch.testing.assert_close(out, torch.cat([z.real, z.imag], dim=-1))


def test_rope_stays_float32_when_model_is_cast() -> None:
    cfg = tiny(rotary_base=500000.0, rope_scaling=True)
    model = build(cfg).to(torch.bfloat16)
    assert model.rotary_emb.inv_freq.dtype == torch.bfloat16  # Module.to casts buffers ...
    cos, _ = model.rotary_emb(torch.arange(4000, 4004).unsqueeze(0))  # ... but the tables are computed exactly.
    ref, _ = build(cfg).rotary_emb(torch.arange(4000, 4004).unsqueeze(0))
    torch.testing.assert_close(cos, ref, rtol=0, atol=0)
    model.rotary_emb.reset_parameters()
    assert model.rotary_emb.inv_freq.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_forward_backward_finite(dtype: torch.dtype) -> None:
    cfg = tiny(num_query_groups=2, qk_layernorm=True)
    model = build(cfg).to(dtype)
    ids = tokens(cfg)
    logits = model(ids)
    assert logits.dtype == dtype and logits.isfinite().all()
    loss = model(ids, labels=ids)
    assert loss.dtype == torch.float32 and loss.isfinite().all()
    loss.mean().backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_params_dtype_rounds_the_float32_init(dtype_name: str) -> None:
    low = build(tiny(params_dtype=dtype_name))
    ref = build(tiny())
    for (name, p), (_, q) in zip(low.named_parameters(), ref.named_parameters()):
        assert p.dtype == getattr(torch, dtype_name), name
        torch.testing.assert_close(p, q.to(p.dtype), rtol=0, atol=0)


def test_init_statistics_and_determinism() -> None:
    cfg = tiny(hidden_size=64, ffn_hidden_size=256, num_layers=4, add_bias_linear=True, init_method_std=0.02)
    model = build(cfg)
    layer = model.layers[0]
    assert math.isclose(layer.mlp.up_proj.weight.std().item(), 0.02, rel_tol=0.05)
    assert math.isclose(layer.mlp.down_proj.weight.std().item(), 0.02 / math.sqrt(8), rel_tol=0.05)
    assert math.isclose(layer.self_attn.o_proj.weight.std().item(), 0.02 / math.sqrt(8), rel_tol=0.1)
    assert math.isclose(model.embed_tokens.weight.std().item(), 0.02, rel_tol=0.05)
    assert torch.count_nonzero(layer.mlp.down_proj.bias) == 0 and torch.count_nonzero(layer.self_attn.o_proj.bias) == 0
    assert all(bool((m.weight == 1).all()) for m in model.modules() if isinstance(m, RMSNorm))
    again = build(cfg)
    for p, q in zip(model.parameters(), again.parameters()):
        assert torch.equal(p, q)
    other = build(cfg, seed=1)
    assert not torch.equal(other.embed_tokens.weight, model.embed_tokens.weight)
    # init_weights re-draws in place from the current seed.
    torch.manual_seed(0)
    other.init_weights()
    for p, q in zip(model.parameters(), other.parameters()):
        assert torch.equal(p, q)


def test_cpu_offloading_activations_same_gradients() -> None:
    cfg = tiny()
    ids = tokens(cfg)
    grads = []
    for offload in (False, True):
        model = build(replace(cfg, cpu_offloading=offload, cpu_offloading_num_layers=1))
        assert model.num_offloaded_layers == (1 if offload else 0)
        model(ids, labels=ids).mean().backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_cpu_offloading_bad_values_raise() -> None:
    with pytest.raises(ConfigValidationError, match="model.cpu_offloading_weights") as err:
        LlamaModel(tiny(cpu_offloading=True, cpu_offloading_weights=True, cpu_offloading_num_layers=1))
    assert err.value.paths == ("model.cpu_offloading_weights",)
    with pytest.raises(ConfigValidationError, match="model.cpu_offloading_num_layers=2"):
        LlamaModel(tiny(cpu_offloading=True, cpu_offloading_num_layers=2))


@pytest.mark.parametrize(
    ("overrides", "path"),
    [
        ({"num_query_groups": 3}, "model.num_query_groups"),
        ({"hidden_size": 30}, "model.num_attention_heads"),
        ({"kv_channels": 5}, "model.kv_channels"),
        ({"num_layers": 0}, "model.num_layers"),
        ({"rope_scaling": True, "rope_high_freq_factor": 1.0}, "model.rope_high_freq_factor"),
        ({"normalization": "BatchNorm"}, "model.normalization"),
    ],
)
def test_invalid_architecture_raises(overrides: dict[str, object], path: str) -> None:
    with pytest.raises(ConfigValidationError) as err:
        LlamaModel(tiny(**overrides))
    assert path in err.value.paths
    assert path in str(err.value)


def test_kv_channels_decoupled_from_hidden() -> None:
    cfg = tiny(kv_channels=16, num_query_groups=2)  # 4 heads x 16 = 64 != hidden 32
    model = build(cfg)
    assert model.layers[0].self_attn.q_proj.weight.shape == (64, 32)
    assert model.layers[0].self_attn.o_proj.weight.shape == (32, 64)
    assert model(tokens(cfg)).shape == (2, 12, 112)


def test_overfits_one_batch() -> None:
    cfg = tiny(num_query_groups=2)
    model = build(cfg)
    ids = tokens(cfg, b=2, s=12)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = model(ids[:, :-1], labels=ids[:, 1:]).mean().item()
    for _ in range(30):
        opt.zero_grad()
        loss = model(ids[:, :-1], labels=ids[:, 1:]).mean()
        loss.backward()
        opt.step()
    assert first > 4.0 and loss.item() < 0.5 * first
