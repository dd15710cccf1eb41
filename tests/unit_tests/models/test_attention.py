"""The shared attention's mask policy (models/attention.py): full causal, or a sliding window of W tokens including
the current one (Hugging Face's ``sliding_window``; megatron-core's ``window_size = (W - 1, 0)``), per layer as
megatron-core's ``window_attn_skip_freq`` places it; the FLOP count of window layers counts only the attended keys."""

import math

import pytest
import torch

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.models.attention import band_mask, causal_attention
from megatron_bridge.models.flops import num_floating_point_operations


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None) -> torch.Tensor:
    """Softmax attention written out: query i sees keys j with i - W < j <= i."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    s = q.shape[2]
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    visible = (j <= i) & ((i - j < window) if window is not None else True)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return scores.masked_fill(~visible, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("window", [None, 1, 5, 16, 40])
def test_window_attention_equals_the_written_out_softmax(window: int | None) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, 16, 8, generator=gen) for n in (4, 2, 2))
    torch.testing.assert_close(causal_attention(q, k, v, window), _reference(q, k, v, window), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(("seq", "window"), [(16, 3), (37, 8), (64, 32)])
def test_blocked_window_gradients_equal_the_written_out_softmax(seq: int, window: int) -> None:
    """Sequences of two windows or more run in query blocks (padding when the length is no multiple of the window):
    the output and the q/k/v gradients equal the written-out softmax's."""
    gen = torch.Generator().manual_seed(2)
    ours = [torch.randn(2, n, seq, 8, generator=gen, requires_grad=True) for n in (4, 2, 2)]
    ref = [t.detach().clone().requires_grad_() for t in ours]
    grad = torch.randn(2, 4, seq, 8, generator=gen)
    out, want = causal_attention(*ours, window), _reference(*ref, window)
    out.backward(grad)
    want.backward(grad)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-6)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-5)


def test_window_of_one_token_returns_its_own_value() -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 9, 4, generator=gen) for _ in range(3))
    torch.testing.assert_close(causal_attention(q, k, v, window=1), v, atol=1e-6, rtol=0)


def test_band_mask_is_hugging_face_sliding_window() -> None:
    """transformers keeps ``kv > q - W`` (``sliding_window_overlay``): W keys including the query's own."""
    pos = torch.arange(6)
    mask = band_mask(pos, pos, 3)
    assert mask.sum(1).tolist() == [1, 2, 3, 3, 3, 3]
    assert mask[5].tolist() == [False, False, False, True, True, True]


@pytest.mark.parametrize("freq", [None, 2, 3, [1, 0, 1, 1, 0, 0]])
def test_attention_window_follows_megatron_core_layer_pattern(freq: int | list[int] | None) -> None:
    from megatron.core.transformer.utils import is_layer_window_attention

    m = ModelConfig(num_layers=6, window_size=(7, 0), window_attn_skip_freq=freq)
    for i in range(6):
        windowed = is_layer_window_attention((7, 0), freq, i + 1)
        assert m.attention_window(i) == (8 if windowed else None)


def test_no_window_means_full_attention_everywhere() -> None:
    m = ModelConfig(num_layers=3, window_attn_skip_freq=2)
    assert [m.attention_window(i) for i in range(3)] == [None, None, None]


def test_window_layers_count_only_the_attended_keys() -> None:
    """Per token, an attention layer counts 4·d·nq FLOPs per key: s keys for full layers, min(W, s) for window ones."""
    full = ModelConfig(num_layers=4, seq_length=128)
    window = ModelConfig(num_layers=4, seq_length=128, window_size=(31, 0), window_attn_skip_freq=2)
    per_key = 3 * 2 * 2 * full.head_dim * full.num_attention_heads  # fwd+bwd, scores and values, per token per key
    saved_keys = 2 * (128 - 32)  # layers 1 and 3 (1-based) are windowed: 96 keys fewer each
    diff = num_floating_point_operations(full, 1) - num_floating_point_operations(window, 1)
    assert diff == per_key * saved_keys * 128
    longer = ModelConfig(num_layers=4, seq_length=128, window_size=(500, 0))
    assert num_floating_point_operations(longer, 1) == num_floating_point_operations(full, 1)
