"""Core attention with a mask policy, shared by every family's attention block: full causal, or a sliding window.

The window follows Hugging Face's convention (``sliding_window`` = W): a query at position ``i`` attends to the keys
at ``i - W + 1 .. i``, W tokens including itself; megatron-core writes the same window as ``window_size = (W - 1, 0)``
(``model.window_size``, Megatron-Bridge's field). Which layers have a window is
:meth:`~megatron_bridge.config.model.ModelConfig.attention_window`.
"""

import torch
from torch.nn import functional as F


def band_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """``[len(q_pos), len(k_pos)]`` boolean mask: key ``j`` is visible to query ``i`` when it is not in the future
    and, with a ``window``, among the last ``window`` positions (``q - window < k <= q``)."""
    mask = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        mask &= k_pos[None, :] > q_pos[:, None] - window
    return mask


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Causal attention of ``q`` ``[b, heads, s, d]`` over ``k``/``v`` ``[b, kv_heads, s, d]`` (grouped-query when
    ``kv_heads < heads``), optionally within a sliding ``window`` of tokens.

    Without a window, or with one at least as long as the sequence, this is SDPA's own causal path; with a shorter
    window, SDPA with the band mask (no more work than full causal attention: the same kernel, a different mask).
    """
    gqa = k.shape[1] != q.shape[1]
    s = q.shape[2]
    if window is None or window >= s:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    pos = torch.arange(s, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=band_mask(pos, pos, window), enable_gqa=gqa)
