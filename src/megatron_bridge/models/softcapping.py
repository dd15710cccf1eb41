"""Logit soft-capping (Gemma 2): ``cap · tanh(x / cap)`` on the attention scores before the softmax
(``model.attn_logit_softcapping``) and on the output layer's logits (``model.final_logit_softcapping``).

SDPA takes no function of the scores, so soft-capped attention computes them explicitly: ``q kᵀ / sqrt(d)`` (the
model's ``softmax_scale`` is already on the queries), capped, masked with -inf, an fp32 softmax, times ``v``, as
transformers' Gemma 2 ``eager_attention_forward``. It holds ``[b, heads, sq, sk]`` scores (in query blocks of the
window under a short window: ``models/attention.py``); it runs on every device and under the all-gather context
parallelism (rule ``logit_softcapping`` refuses ring attention).
"""

import torch


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap · tanh(x / cap)``, in transformers' order of operations (divide, tanh, multiply)."""
    return torch.tanh(x / cap) * cap


def softcapped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, cap: float,
                         sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of ``q`` ``[n, heads, sq, d]`` over ``k``/``v`` ``[n, kv_heads, sk, d]`` with the scores
    soft-capped at ``cap`` and the boolean ``mask`` (``[..., sq, sk]``, True = visible); scale ``1/sqrt(d)``; with
    ``sinks`` ``[heads]``, one sink logit per head joins each softmax after the cap and is dropped after it.
    Returns ``[n, heads, sq, d]`` in ``q``'s dtype."""
    heads, d = q.shape[1], q.shape[-1]
    if k.shape[1] != heads:
        k, v = (t.repeat_interleave(heads // k.shape[1], dim=1) for t in (k, v))
    scores = softcap(torch.matmul(q, k.transpose(-1, -2)) * d**-0.5, cap)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        sink = sinks.to(scores.dtype).view(1, heads, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1, dtype=torch.float32)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    return torch.matmul(probs.to(q.dtype), v)
