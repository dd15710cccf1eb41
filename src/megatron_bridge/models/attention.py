"""Core attention with a mask policy, shared by every family's attention block: full causal, or a sliding window.

The window follows Hugging Face's convention (``sliding_window`` = W): a query at position ``i`` attends to the keys
at ``i - W + 1 .. i``, W tokens including itself; megatron-core writes the same window as ``window_size = (W - 1, 0)``
(``model.window_size``, Megatron-Bridge's field). Which layers have a window is
:meth:`~megatron_bridge.config.model.ModelConfig.attention_window`.
"""

import torch
from torch.nn import functional as F

from megatron_bridge.models.attention_sinks import sdpa_with_sink
from megatron_bridge.models.softcapping import softcapped_attention


def band_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """``[len(q_pos), len(k_pos)]`` boolean mask: key ``j`` is visible to query ``i`` when it is not in the future
    and, with a ``window``, among the last ``window`` positions (``q - window < k <= q``)."""
    mask = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        mask &= k_pos[None, :] > q_pos[:, None] - window
    return mask


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None = None,
                     sinks: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
    """Causal attention of ``q`` ``[b, heads, s, d]`` over ``k``/``v`` ``[b, kv_heads, s, d]`` (grouped-query when
    ``kv_heads < heads``), optionally within a sliding ``window`` of tokens, optionally with one sink logit per head
    (``sinks`` ``[heads]``: :mod:`megatron_bridge.models.attention_sinks`, the fused kernel with a log-sum-exp
    rescale on CPU, on every path), optionally with the scores soft-capped (``softcap``: Gemma 2's
    ``cap · tanh(scores / cap)``, :mod:`megatron_bridge.models.softcapping`, explicit scores).

    Without a window, or with one at least as long as the sequence, this is SDPA's own causal path; with a shorter
    window, SDPA with the band mask, in query blocks once the sequence is :data:`BLOCKED_MIN_RATIO` windows long or
    more (so a window never costs more than full attention: scripts/performance/window_attention.py measures it).
    """
    gqa = k.shape[1] != q.shape[1]
    s = q.shape[2]
    if (window is None or window >= s) and softcap is None:
        if sinks is not None:
            return sdpa_with_sink(q, k, v, None, sinks, gqa)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if window is None or s < BLOCKED_MIN_RATIO * window:
        pos = torch.arange(s, device=q.device)
        return masked_attention(q, k, v, band_mask(pos, pos, window), gqa, sinks, softcap)
    return _blocked_window_attention(q, k, v, window, gqa, sinks, softcap)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, gqa: bool,
                     sinks: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
    """Attention of ``q`` over ``k``/``v`` under the boolean ``mask`` (True = visible), scale ``1/sqrt(d)``: SDPA,
    with the sink column (:func:`sdpa_with_sink`), or with soft-capped explicit scores
    (:func:`softcapped_attention`, the sinks joined after the cap)."""
    if softcap is not None:
        return softcapped_attention(q, k, v, mask, softcap, sinks)
    if sinks is not None:
        return sdpa_with_sink(q, k, v, mask, sinks, gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


BLOCKED_MIN_RATIO = 2
"""Sequences at least this many windows long run window attention in query blocks (:func:`_blocked_window_attention`);
shorter ones in one SDPA call with the band mask."""


def _blocked_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                              gqa: bool, sinks: torch.Tensor | None = None,
                              softcap: float | None = None) -> torch.Tensor:
    """Window attention in blocks of ``window`` queries, each over the ``2 * window`` keys that end with its own block
    (the keys before the sequence are padding, masked out): one SDPA call over ``[b * blocks, heads, W, 2W]``, about
    ``2 * W`` keys per query instead of the whole sequence."""
    b, h, s, d = q.shape
    blocks = -(-s // window)
    pad = blocks * window - s
    q_blocks = F.pad(q, (0, 0, 0, pad)).view(b, h, blocks, window, d).transpose(1, 2).reshape(b * blocks, h, window, d)
    k_blocks, v_blocks = (_key_blocks(t, window, blocks, pad) for t in (k, v))
    local = torch.arange(window, device=q.device)
    mask = band_mask(local + window, torch.arange(2 * window, device=q.device), window)
    mask = mask.expand(b, blocks, 1, window, 2 * window).clone()
    mask[:, 0, :, :, :window] = False  # block 0's first half is padding before the sequence
    mask = mask.view(b * blocks, 1, window, -1)
    out = masked_attention(q_blocks, k_blocks, v_blocks, mask, gqa, sinks, softcap)
    return out.view(b, blocks, h, window, d).transpose(1, 2).reshape(b, h, blocks * window, d)[:, :, :s]


def _key_blocks(t: torch.Tensor, window: int, blocks: int, pad: int) -> torch.Tensor:
    """``[b * blocks, heads, 2W, d]``: for query block ``n``, the keys (or values) at positions ``(n-1)W .. (n+1)W - 1``
    (zeros before the sequence and after its end)."""
    b, heads, _, d = t.shape
    padded = F.pad(t, (0, 0, window, pad))  # [b, heads, (blocks + 1) W, d]
    blocked = padded.unfold(2, 2 * window, window).permute(0, 2, 1, 4, 3)  # [b, blocks, heads, 2W, d]
    return blocked.reshape(b * blocks, heads, 2 * window, d)
