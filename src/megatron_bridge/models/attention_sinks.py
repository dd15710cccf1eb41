"""Attention sinks (GPT-OSS; megatron-core's ``softmax_type``): one extra logit per head joins each query's softmax
and is dropped after it, so a query may give part of its attention to nothing.

The sink runs inside SDPA as an explicit extra key column: the queries get one more dimension holding
``sink / scale`` (per head), the keys a zero there and one extra key that is zero but for a one in it, the values a
zero row for that key (and a zero column, dropped from the output). The extra key's score is then exactly the sink
logit, every other score is unchanged, and the output is ``softmax([scores, sink])[..., :-1] @ v``, as transformers'
GPT-OSS ``eager_attention_forward`` computes it; gradients reach the sinks through the queries' extra dimension.
On CPU at 1024 tokens (8 heads of 64, forward, medians on a shared 2-core machine) it costs about 1.7-2x the plain
causal kernel (an explicit mask instead of the causal flag, one more column); a log-sum-exp rescale of the fused
kernel's output would cost less (not done yet).
"""

import torch
from torch.nn import functional as F


def sdpa_with_sink(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, sinks: torch.Tensor,
                   gqa: bool) -> torch.Tensor:
    """SDPA of ``q`` ``[n, heads, sq, d]`` over ``k``/``v`` ``[n, kv_heads, sk, d]`` under the boolean ``mask``
    (``[..., sq, sk]``, True = visible), with one sink logit per head (``sinks`` ``[heads]``) joined to each query's
    softmax; scale ``1/sqrt(d)``. Returns ``[n, heads, sq, d]``."""
    n, heads, sq, d = q.shape
    scale = d**-0.5
    sink_dim = (sinks.to(q.dtype) / scale).view(1, heads, 1, 1).expand(n, heads, sq, 1)
    q_x = torch.cat([q, sink_dim], dim=-1)
    sink_key = torch.zeros(n, k.shape[1], 1, d + 1, dtype=k.dtype, device=k.device)
    sink_key[..., -1] = 1.0
    k_x = torch.cat([F.pad(k, (0, 1)), sink_key], dim=2)
    # The values padded to the keys' width too (one zero column, dropped after): SDPA's fused CPU kernel needs equal
    # widths and falls back to the unfused math path otherwise (about 3x slower at 1024 tokens).
    v_x = F.pad(v, (0, 1, 0, 1))
    mask_x = torch.cat([mask, torch.ones(*mask.shape[:-1], 1, dtype=torch.bool, device=mask.device)], dim=-1)
    return F.scaled_dot_product_attention(q_x, k_x, v_x, attn_mask=mask_x, scale=scale, enable_gqa=gqa)[..., :d]
