"""Attention sinks (``model.softmax_type``, models/attention_sinks.py) against transformers' GPT-OSS
``eager_attention_forward``: outputs and the gradients of q, k, v and the sinks, with full causal attention, a
window in one SDPA call and a window in query blocks, grouped-query heads; the fused CPU path against the explicit
sink-column path (causal flag, windows, context-parallel-shaped masks, fp32, bf16, autocast); "off-by-one" is a zero
sink; the model's ``sinks`` parameter, its parameter count and FLOP term."""

import pytest
import torch
from torch import nn

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.models.attention import band_mask, causal_attention
from megatron_bridge.models.attention_sinks import _fused_applies, sdpa_with_sink, sdpa_with_sink_column
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


def _inputs(sq: int, sk: int, kv_heads: int, learnable: bool, dtype: torch.dtype) -> list[torch.Tensor]:
    """q ``[2, 4, sq, 16]``, k and v ``[2, kv_heads, sk, 16]`` in ``dtype``, the sinks ``[4]`` (fp32; zeros without a
    gradient unless ``learnable``), the output gradient last."""
    gen = torch.Generator().manual_seed(sq * 100 + sk + kv_heads)
    q, k, v = (torch.randn(2, n, s, 16, generator=gen).to(dtype) for n, s in ((4, sq), (kv_heads, sk), (kv_heads, sk)))
    sinks = 2.0 * torch.randn(4, generator=gen) if learnable else torch.zeros(4)
    return [q, k, v, sinks, torch.randn(2, 4, sq, 16, generator=gen).to(dtype)]


def _run(fn, inputs: list[torch.Tensor], learnable: bool) -> list[torch.Tensor | None]:  # noqa: ANN001
    """``fn(q, k, v, sinks)`` and the gradients of q, k, v and the sinks under the last input as output gradient."""
    leaves = [t.detach().clone().requires_grad_(i < 3 or learnable) for i, t in enumerate(inputs[:4])]
    out = fn(*leaves)
    out.backward(inputs[4].to(out.dtype))
    return [out.detach(), *(t.grad for t in leaves)]


# (queries, keys, KV heads, window, learnable): the causal flag; grouped-query; windows; off-by-one; the rectangular
# masks of context parallelism's query blocks (the queries are the last `sq` positions of the keys).
FUSED_CASES = [(24, 24, 4, None, True), (24, 24, 2, None, True), (37, 37, 2, 8, True), (24, 24, 2, None, False),
               (16, 40, 2, None, True), (16, 40, 2, 12, True)]


@pytest.mark.parametrize(("sq", "sk", "kv_heads", "window", "learnable"), FUSED_CASES)
def test_fused_sinks_equal_the_sink_column(sq: int, sk: int, kv_heads: int, window: int | None,
                                           learnable: bool) -> None:
    inputs = _inputs(sq, sk, kv_heads, learnable, torch.float32)
    assert _fused_applies(*inputs[:3])  # so that this compares the two paths
    mask = band_mask(torch.arange(sk - sq, sk), torch.arange(sk), window)
    fused_mask = None if sq == sk and window is None else mask  # None: the kernel's causal flag
    gqa = kv_heads != 4
    fused = _run(lambda q, k, v, s: sdpa_with_sink(q, k, v, fused_mask, s, gqa), inputs, learnable)
    column = _run(lambda q, k, v, s: sdpa_with_sink_column(q, k, v, mask, s, gqa), inputs, learnable)
    torch.testing.assert_close(fused[0], column[0], atol=1e-6, rtol=1e-6)
    for a, b in zip(fused[1:], column[1:], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert (fused[4] is not None) == learnable


def test_fused_sinks_with_a_fully_hidden_row_give_it_to_the_sink() -> None:
    """A query that sees no key gives all its attention to the sink: output 0, no gradient through it."""
    inputs = _inputs(12, 12, 2, True, torch.float32)
    mask = band_mask(torch.arange(12), torch.arange(12), None)
    mask[5] = False
    fused = _run(lambda q, k, v, s: sdpa_with_sink(q, k, v, mask, s, True), inputs, True)
    column = _run(lambda q, k, v, s: sdpa_with_sink_column(q, k, v, mask, s, True), inputs, True)
    assert torch.equal(fused[0][:, :, 5], torch.zeros(2, 4, 16))
    for a, b in zip(fused, column, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _relative_error(a: torch.Tensor, reference: torch.Tensor) -> float:
    return ((a.double() - reference.double()).norm() / reference.double().norm()).item()


@pytest.mark.parametrize(("sq", "sk", "kv_heads", "window"), [(64, 64, 2, None), (37, 37, 2, 8), (16, 40, 2, 12)])
def test_fused_sinks_in_bf16(sq: int, sk: int, kv_heads: int, window: int | None) -> None:
    """bf16 inputs (fp32 sinks) against the fp64 sink column: within 1e-2 relative (Frobenius) for the output and the
    q, k, v gradients, where bf16's own rounding gives about 4e-3 (the column path in bf16 is as far); 2e-2 for the
    sinks' gradient, a sum over the rows whose terms cancel (seen: 1.1e-2 fused, up to 8.5e-3 for the column)."""
    inputs = _inputs(sq, sk, kv_heads, True, torch.float64)
    mask = band_mask(torch.arange(sk - sq, sk), torch.arange(sk), window)
    fused_mask = None if sq == sk and window is None else mask
    reference = _run(lambda q, k, v, s: sdpa_with_sink_column(q, k, v, mask, s, True), inputs, True)
    low = [t.bfloat16() for t in inputs[:3]] + [inputs[3].float(), inputs[4].bfloat16()]
    fused = _run(lambda q, k, v, s: sdpa_with_sink(q, k, v, fused_mask, s, True), low, True)
    assert fused[0].dtype == torch.bfloat16 and fused[4].dtype == torch.float32
    for a, b, tol in zip(fused, reference, (1e-2, 1e-2, 1e-2, 1e-2, 2e-2), strict=True):
        assert _relative_error(a, b) < tol


def test_fused_sinks_under_autocast() -> None:
    """fp32 inputs under CPU bf16 autocast run in bf16 (as SDPA would), within 1e-2 relative of fp32."""
    inputs = _inputs(32, 32, 2, True, torch.float32)
    reference = _run(lambda q, k, v, s: causal_attention(q, k, v, sinks=s), inputs, True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = _run(lambda q, k, v, s: causal_attention(q, k, v, sinks=s), inputs, True)
    assert fused[0].dtype == torch.bfloat16
    for a, b in zip(fused, reference, strict=True):
        assert _relative_error(a, b) < 1e-2


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
