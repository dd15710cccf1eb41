"""Gemma 2's logit soft-capping (``models/softcapping.py``): the explicit-score attention against transformers'
Gemma 2 ``eager_attention_forward`` on every path of the shared attention (full, one-call window, blocked window,
grouped-query, with sinks), the caps acting in the tiny recipe, the rule ``logit_softcapping``, the megatron-core
engine's refusal, and the Gemma 2 config mapping's defaults and legacy keys."""

import pytest
import torch

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError, ConfigValidationError
from megatron_bridge.models.attention import band_mask, causal_attention
from megatron_bridge.models.llama import LlamaModel
from megatron_bridge.recipes import get_recipe


def _hf_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None, cap: float) -> torch.Tensor:
    """transformers' Gemma 2 eager attention with its mask (min-value fill) and softcap, ``[b, h, s, d]``."""
    from types import SimpleNamespace

    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    s = q.shape[2]
    pos = torch.arange(s)
    mask = torch.zeros(s, s).masked_fill(~band_mask(pos, pos, window), torch.finfo(torch.float32).min)
    module = SimpleNamespace(head_dim=q.shape[-1], num_key_value_groups=q.shape[1] // k.shape[1], training=False)
    out, _ = eager_attention_forward(module, q, k, v, mask[None, None], scaling=q.shape[-1] ** -0.5, softcap=cap)
    return out.transpose(1, 2)


@pytest.mark.parametrize(("window", "s"), [(None, 24), (8, 12), (8, 40), (5, 23)],
                         ids=["full", "window-one-call", "window-blocked", "window-blocked-ragged"])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_softcapped_attention_equals_transformers_gemma2(window, s, kv_heads) -> None:  # noqa: ANN001
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, s, 16, generator=gen) * 3 for h in (4, kv_heads, kv_heads))
    ours = causal_attention(q, k, v, window, softcap=2.0)
    torch.testing.assert_close(ours, _hf_attention(q, k, v, window, 2.0), atol=1e-5, rtol=0)  # values up to ~8
    assert (ours - causal_attention(q, k, v, window)).abs().max() > 1e-2  # the cap acts at this scale


def test_softcapped_attention_with_sinks_joins_the_sink_after_the_cap() -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 10, 8, generator=gen) * 3 for _ in range(3))
    sinks = torch.tensor([0.5, -1.0])
    scores = torch.tanh(q @ k.transpose(-1, -2) * 8**-0.5 / 2.0) * 2.0
    scores = scores.masked_fill(~band_mask(torch.arange(10), torch.arange(10), None), float("-inf"))
    full = torch.cat([scores, sinks.view(1, 2, 1, 1).expand(1, 2, 10, 1)], dim=-1).softmax(-1)[..., :-1]
    torch.testing.assert_close(causal_attention(q, k, v, sinks=sinks, softcap=2.0), full @ v, atol=1e-6, rtol=0)


def test_a_huge_cap_is_plain_attention() -> None:
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 4, 20, 16, generator=gen) for _ in range(3))
    torch.testing.assert_close(causal_attention(q, k, v, 6, softcap=1e6), causal_attention(q, k, v, 6),
                               atol=1e-6, rtol=0)


def test_both_caps_act_in_the_tiny_recipe() -> None:
    """Dropping either cap changes the tiny Gemma 2's logits (so its layout tests would see a lost cap)."""
    cfg = get_recipe("tiny_gemma2").fn().model
    torch.manual_seed(0)
    model = LlamaModel(cfg, device="cpu").eval()
    tokens = torch.randint(0, cfg.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(tokens)
        assert ref.abs().max() <= cfg.final_logit_softcapping
        model.config.final_logit_softcapping = None
        assert (model(tokens) - ref).abs().max() > 1e-2
        model.config.final_logit_softcapping = cfg.final_logit_softcapping
        for layer in model.layers:
            layer.self_attn.softcap = None
        assert (model(tokens) - ref).abs().max() > 1e-2


@pytest.mark.parametrize(("fields", "match"), [
    ({"attn_logit_softcapping": 0.0}, "model.attn_logit_softcapping=0.0"),
    ({"final_logit_softcapping": -3.0}, "model.final_logit_softcapping=-3.0"),
    ({"multi_latent_attention": True}, "multi_latent_attention=True"),
])
def test_rule_logit_softcapping_names_bad_settings(fields, match) -> None:  # noqa: ANN001
    cfg = get_recipe("tiny_gemma2").fn()
    for name, value in fields.items():
        setattr(cfg.model, name, value)
    with pytest.raises(ConfigValidationError, match=rf"{match}.*\[rule logit_softcapping\]"):
        cfg.validate(world_size=1)


def test_megatron_core_engine_refuses_the_caps_by_name() -> None:
    cfg = get_recipe("tiny_gemma2").fn()
    cfg.model.engine = "megatron_core"
    with pytest.raises(ConfigValidationError, match=r"\[rule megatron_core_features\]") as err:
        cfg.validate(world_size=1)
    for field in ("attn_logit_softcapping", "final_logit_softcapping", "post_norms"):
        assert f"model.{field}" in str(err.value)


_HF = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 32, "intermediate_size": 64,
       "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 64}


def test_gemma2_config_defaults_legacy_keys_and_null_caps() -> None:
    from megatron_bridge.bridge.families.base import family_by_name

    family = family_by_name("gemma2")
    legacy = {**_HF, "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
              "cache_implementation": "hybrid", "rope_theta": 10000.0, "sliding_window": 4096}
    config = family.config_from_hf(legacy)
    assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (50.0, 30.0)  # transformers' defaults
    assert config.window_attn_skip_freq == [1, 0, 1] and config.window_size == (4095, 0)  # the first layer windowed
    assert config.softmax_scale == 256**-0.5 and not config.qk_layernorm and config.rotary_base_local is None
    uncapped = family.config_from_hf({**_HF, "attn_logit_softcapping": None, "final_logit_softcapping": None})
    assert (uncapped.attn_logit_softcapping, uncapped.final_logit_softcapping) == (None, None)
    with pytest.raises(BridgeError, match="attn_logit_softcapping=-1"):
        family.config_from_hf({**_HF, "attn_logit_softcapping": -1})
    with pytest.raises(BridgeError, match="hidden_act='silu'"):
        family.config_from_hf({**_HF, "hidden_act": "silu"})


def test_tiny_gemma2_round_trips_and_gemma3_refuses_caps() -> None:
    from megatron_bridge.bridge.families.base import family_by_name

    model = get_recipe("tiny_gemma2").fn().model
    hf = family_by_name("gemma2").config_to_hf(model)
    assert hf["attn_logit_softcapping"] == 2.0 and hf["final_logit_softcapping"] == 3.0
    assert hf["layer_types"] == ["sliding_attention", "full_attention"] * 2 and "hidden_act" not in hf
    back = family_by_name("gemma2").config_from_hf(hf)
    for name in ("attn_logit_softcapping", "final_logit_softcapping", "window_size", "softmax_scale", "rotary_base",
                 "num_query_groups", "kv_channels"):
        assert getattr(back, name) == getattr(model, name), name
    assert back.window_attn_skip_freq == [1, 0, 1, 0]
    model.qk_layernorm, model.family = True, "gemma3"
    with pytest.raises(BridgeError, match="is not a gemma3 model"):
        family_by_name("gemma3").config_to_hf(model)
    assert ModelConfig().attn_logit_softcapping is None and ModelConfig().final_logit_softcapping is None


def test_families_without_soft_capping_refuse_to_export_a_capped_model() -> None:
    from megatron_bridge.bridge.families.base import family_by_name

    model = get_recipe("tiny_llama").fn().model
    family_by_name("llama").config_to_hf(model)
    model.final_logit_softcapping = 30.0
    with pytest.raises(BridgeError, match="LlamaForCausalLM has no logit soft-capping.*final_logit_softcapping=30.0"):
        family_by_name("llama").config_to_hf(model)


def _explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, cap: float,
              sinks: torch.Tensor | None) -> torch.Tensor:
    """The whole-score formula autograd differentiates: capped scores, -inf mask, (sink column,) fp32 softmax."""
    heads = q.shape[1]
    k, v = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (k, v))
    scores = torch.tanh(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 / cap) * cap
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks.view(1, heads, 1, 1).expand(*scores.shape[:-1], 1)], dim=-1)
    return scores.softmax(-1)[..., : k.shape[2]] @ v


@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("block_elements", [1 << 24, 2 * 4 * 24])  # one block; blocks of one query
def test_blockwise_backward_equals_autograd_of_the_explicit_scores(with_sinks, block_elements,  # noqa: ANN001
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The recomputing backward (fp64, grouped-query heads, a window mask with fully masked key columns) gives the
    gradients autograd gets from the whole-score formula, for q, k, v and the sinks."""
    from megatron_bridge.models import softcap_blocks, softcapping

    monkeypatch.setattr(softcap_blocks, "BLOCK_ELEMENTS", block_elements)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, h, 24, 8, generator=gen, dtype=torch.float64) * 3 for h in (4, 2, 2))
    sinks = torch.randn(4, generator=gen, dtype=torch.float64) if with_sinks else None
    mask = band_mask(torch.arange(24), torch.arange(24), 7)
    inputs = [t.requires_grad_() for t in (q, k, v) + ((sinks,) if with_sinks else ())]
    grad_out = torch.randn(2, 4, 24, 8, generator=gen, dtype=torch.float64)
    ours = torch.autograd.grad(softcapping.softcapped_attention(q, k, v, mask, 2.0, sinks), inputs, grad_out)
    want = torch.autograd.grad(_explicit(q, k, v, mask, 2.0, sinks), inputs, grad_out)
    for got, exp in zip(ours, want, strict=True):
        torch.testing.assert_close(got, exp, atol=1e-10, rtol=1e-10)


def test_blockwise_attention_keeps_no_scores_for_the_backward() -> None:
    """What autograd keeps for the backward is q, k, v, the output and the log-sum-exp: no ``[.., sq, sk]`` tensor
    (the memory the activation estimate counts, perf/activations.py)."""
    from megatron_bridge.models.softcapping import softcapped_attention

    q, k, v = (torch.randn(1, 2, 64, 8, requires_grad=True) for _ in range(3))
    mask = band_mask(torch.arange(64), torch.arange(64), None)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        softcapped_attention(q * 1.0, k, v, mask, 2.0).sum().backward()
    assert (64, 64) in {tuple(s[-2:]) for s in saved if len(s) >= 2}  # the mask itself (an input, not a copy)
    assert not [s for s in saved if len(s) == 4 and tuple(s[-2:]) == (64, 64)]
