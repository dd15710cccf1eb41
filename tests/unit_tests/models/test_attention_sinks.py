"""Attention sinks (``model.softmax_type``, models/attention_sinks.py) against transformers' GPT-OSS
``eager_attention_forward``: outputs and the gradients of q, k, v and the sinks, with full causal attention, a
window in one SDPA call and a window in query blocks, grouped-query heads; "off-by-one" is a zero sink; the model's
``sinks`` parameter, its parameter count and FLOP term."""

import pytest
import torch
from torch import nn

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.models.attention import band_mask, causal_attention
from megatron_bridge.models.flops import num_floating_point_operations, num_parameters
from megatron_bridge.models.llama import LlamaModel


class _HFModule(nn.Module):
    """What GPT-OSS's eager attention reads from its module: the sinks and the grouped-query factor."""

    def __init__(self, sinks: torch.Tensor, groups: int) -> None:
        super().__init__()
        self.sinks, self.num_key_value_groups = sinks, groups


def _hf(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, window: int | None) -> torch.Tensor:
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    pos = torch.arange(q.shape[2])
    additive = torch.zeros(q.shape[2], q.shape[2]).masked_fill(~band_mask(pos, pos, window), torch.finfo(q.dtype).min)
    out, _ = eager_attention_forward(_HFModule(sinks, q.shape[1] // k.shape[1]).eval(), q, k, v, additive[None, None],
                                     scaling=q.shape[-1] ** -0.5)
    return out.transpose(1, 2)


@pytest.mark.parametrize(("seq", "window"), [(24, None), (24, 16), (37, 8), (64, 16)])
def test_sinks_equal_gpt_oss_eager_attention(seq: int, window: int | None) -> None:
    gen = torch.Generator().manual_seed(0)
    ours = [torch.randn(2, n, seq, 16, generator=gen, requires_grad=True) for n in (4, 2, 2)]
    ours.append((2.0 * torch.randn(4, generator=gen)).requires_grad_())
    ref = [t.detach().clone().requires_grad_() for t in ours]
    grad = torch.randn(2, 4, seq, 16, generator=gen)
    out, want = causal_attention(*ours[:3], window, sinks=ours[3]), _hf(*ref, window)
    out.backward(grad)
    want.backward(grad)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-6)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-5)
    plain = causal_attention(*(t.detach() for t in ours[:3]), window)
    assert (plain - out.detach()).abs().max() > 1e-2  # the sinks take a visible share of the attention


def test_off_by_one_is_a_zero_sink() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, softmax_type="off-by-one")
    model = LlamaModel(cfg)
    learnable = LlamaModel(ModelConfig(**{**cfg.__dict__, "softmax_type": "learnable"}), device="meta")
    learnable.to_empty(device="cpu")
    learnable.init_weights()
    assert torch.equal(learnable.layers[0].self_attn.sinks, torch.zeros(4))  # initialized to zero
    learnable.load_state_dict(model.state_dict(), strict=False)
    tokens = torch.randint(0, 256, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), learnable(tokens), atol=0, rtol=0)
    assert "layers.0.self_attn.sinks" not in model.state_dict()


def test_learnable_sinks_are_parameters_counted_with_their_flops() -> None:
    cfg = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, softmax_type="learnable")
    model = LlamaModel(cfg, device="meta")
    names = [n for n, _ in model.named_parameters()]
    assert "layers.1.self_attn.sinks" in names
    assert num_parameters(cfg) == sum(p.numel() for p in model.parameters())
    vanilla = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4)
    extra = num_floating_point_operations(cfg, 1) - num_floating_point_operations(vanilla, 1)
    assert extra == 3 * 2 * 2 * cfg.head_dim * 4 * cfg.num_layers * cfg.seq_length  # one more key per query


def test_sinks_of_a_model_learn() -> None:
    """Every layer's sinks get a gradient through the model's loss (window and full layers alike)."""
    torch.manual_seed(0)
    cfg = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, softmax_type="learnable",
                      window_size=(7, 0), window_attn_skip_freq=2)
    model = LlamaModel(cfg)
    tokens = torch.randint(0, 256, (2, 20))
    model(tokens, labels=tokens).mean().backward()
    for layer in model.layers:
        assert layer.self_attn.sinks.grad is not None and layer.self_attn.sinks.grad.abs().min() > 0
