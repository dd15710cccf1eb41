"""Logit soft-capping (Gemma 2): ``cap · tanh(x / cap)`` on the attention scores before the softmax
(``model.attn_logit_softcapping``) and on the output layer's logits (``model.final_logit_softcapping``).

SDPA takes no function of the scores, so soft-capped attention computes them itself, as transformers' Gemma 2
``eager_attention_forward`` does: ``q kᵀ / sqrt(d)`` in the inputs' dtype, capped, masked with -inf, an fp32 softmax
(with sinks, one sink logit per head joins it after the cap and is dropped after it), the probabilities in the
inputs' dtype times ``v``. :class:`_SoftcappedAttention` does that in blocks of queries (each over the span of keys
its mask lets it see: about half the work of the whole scores under a causal mask) and keeps only ``q``, ``k``,
``v``, the output and each query's fp32 log-sum-exp for the backward, which recomputes a block's scores from them
(as flash attention does): memory is ``O(block × keys)`` per head instead of the ``[b, heads, sq, sk]`` scores,
probabilities and their casts that autograd would keep for every layer. It runs on every device and under the
all-gather context parallelism (rule ``logit_softcapping`` refuses ring attention).
"""

import torch

from megatron_bridge.models import softcap_blocks


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap · tanh(x / cap)``, in transformers' order of operations (divide, tanh, multiply)."""
    return torch.tanh(x / cap) * cap


def softcapped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, cap: float,
                         sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of ``q`` ``[n, heads, sq, d]`` over ``k``/``v`` ``[n, kv_heads, sk, d]`` with the scores
    soft-capped at ``cap`` and the boolean ``mask`` (``[..., sq, sk]``, True = visible); scale ``1/sqrt(d)``; with
    ``sinks`` ``[heads]``, one sink logit per head joins each softmax after the cap and is dropped after it.
    Returns ``[n, heads, sq, d]`` in ``q``'s dtype (module docstring)."""
    return _SoftcappedAttention.apply(q, k, v, mask, float(cap), sinks)


def _block_size(q: torch.Tensor, sk: int) -> int:
    n, heads, sq, _ = q.shape
    return softcap_blocks.block_rows(n, heads, sq, sk, q.device.type)


def _repeat_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    return t if t.shape[1] == heads else t.repeat_interleave(heads // t.shape[1], dim=1)


def _blocks(mask: torch.Tensor, sq: int, block: int) -> list[tuple[int, int, slice]]:
    """``(start, stop, keys)`` of each query block: ``keys`` is the span of key columns any of its rows of ``mask``
    sees (the rest is skipped: under a causal mask the keys after the block's last query, under a window the keys
    before its first one's window). Found once per call (the forward), as it reads the mask on the host."""
    spans = []
    for start in range(0, sq, block):
        stop = min(sq, start + block)
        rows = _rows(mask, start, stop, slice(None))
        seen = rows.reshape(-1, rows.shape[-1]).any(0).nonzero()
        keys = slice(int(seen[0]), int(seen[-1]) + 1) if len(seen) else slice(0, rows.shape[-1])
        spans.append((start, stop, keys))
    return spans


def _rows(mask: torch.Tensor, start: int, stop: int, keys: slice) -> torch.Tensor:
    """A query block's rows of ``mask`` over the ``keys`` columns (a view)."""
    rows = mask if mask.shape[-2] == 1 else mask[..., start:stop, :]
    return rows[..., keys]


def _capped_scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, cap: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the masked capped scores, ``tanh(raw / cap)``) of a query block, in the inputs' dtype."""
    t = torch.tanh(torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5 / cap)
    return (t * cap).masked_fill(~mask, float("-inf")), t


def _with_sink(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    if sinks is None:
        return scores
    sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.cat([scores, sink], dim=-1)


class _SoftcappedAttention(torch.autograd.Function):
    """Blockwise soft-capped attention whose backward recomputes the scores (module docstring)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,  # noqa: ANN001
                cap: float, sinks: torch.Tensor | None) -> torch.Tensor:
        heads, sq = q.shape[1], q.shape[2]
        kr, vr = _repeat_kv(k, heads), _repeat_kv(v, heads)
        out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        lse = torch.empty(q.shape[:-1], dtype=_accumulation(q), device=q.device)
        ctx.blocks = _blocks(mask, sq, _block_size(q, k.shape[2]))
        for start, stop, keys in ctx.blocks:
            scores, _ = _capped_scores(q[:, :, start:stop], kr[:, :, keys], _rows(mask, start, stop, keys), cap)
            logits = _with_sink(scores, sinks).to(lse.dtype)
            lse[:, :, start:stop] = torch.logsumexp(logits, dim=-1)
            probs = torch.exp(logits[..., : scores.shape[-1]] - lse[:, :, start:stop, None])
            out[:, :, start:stop] = torch.matmul(probs.to(q.dtype), vr[:, :, keys])
        ctx.save_for_backward(q, k, v, mask, out, lse, sinks)
        ctx.cap = cap
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # noqa: ANN001
        q, k, v, mask, out, lse, sinks = ctx.saved_tensors
        heads = q.shape[1]
        kr, vr = _repeat_kv(k, heads), _repeat_kv(v, heads)
        acc = lse.dtype
        dq = torch.empty_like(q)
        dk, dv = (torch.zeros(t.shape, dtype=acc, device=t.device) for t in (kr, vr))
        dsinks = torch.zeros(heads, dtype=acc, device=q.device) if sinks is not None else None
        grad_out = grad_out.to(acc)
        row = (grad_out * out.to(acc)).sum(-1)  # rowsum(dO · O), [n, heads, sq]
        scale = q.shape[-1] ** -0.5
        for start, stop, keys in ctx.blocks:
            qb, go, lb, rb = (t[:, :, start:stop] for t in (q, grad_out, lse, row))
            kb, vb = kr[:, :, keys].to(acc), vr[:, :, keys].to(acc)
            scores, t = _capped_scores(qb, kr[:, :, keys], _rows(mask, start, stop, keys), ctx.cap)
            probs = torch.exp(scores.to(acc) - lb[..., None])  # the softmax's probabilities (sink column dropped)
            dv[:, :, keys] += torch.matmul(probs.transpose(-1, -2), go)
            dprobs = torch.matmul(go, vb.transpose(-1, -2))
            draw = probs * (dprobs - rb[..., None]) * (1 - t.to(acc) ** 2) * scale  # through softmax, cap, scale
            dq[:, :, start:stop] = torch.matmul(draw, kb).to(q.dtype)
            dk[:, :, keys] += torch.matmul(draw.transpose(-1, -2), qb.to(acc))
            if dsinks is not None:
                dsinks -= (torch.exp(sinks.to(acc).view(1, -1, 1) - lb) * rb).sum(dim=(0, 2))
        return (dq, _sum_groups(dk, k).to(k.dtype), _sum_groups(dv, v).to(v.dtype), None, None,
                None if dsinks is None else dsinks.to(sinks.dtype))


def _accumulation(q: torch.Tensor) -> torch.dtype:
    """fp32 for the softmax and the gradients (fp64 for fp64 inputs)."""
    return torch.promote_types(q.dtype, torch.float32)


def _sum_groups(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The gradient of the heads repeated for grouped-query attention, summed back onto ``like``'s kv heads."""
    n, kv_heads = like.shape[0], like.shape[1]
    if grad.shape[1] == kv_heads:
        return grad
    return grad.view(n, kv_heads, grad.shape[1] // kv_heads, *grad.shape[2:]).sum(2)
