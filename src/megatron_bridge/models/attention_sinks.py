"""Attention sinks (GPT-OSS; megatron-core's ``softmax_type``): one extra logit per head joins each query's softmax
and is dropped after it, so a query may give part of its attention to nothing.

With the plain attention output ``O`` of a query row and its log-sum-exp ``L`` (over the scaled scores), the sink
softmax over ``[scores, sink]`` has the log-normalizer ``L' = logaddexp(L, sink)``, and its output is the plain one
rescaled: ``O' = exp(L - L') · O = sigmoid(L - sink) · O``. On CPU (:func:`sdpa_with_sink`) the forward is then one
fused flash kernel returning ``(O, L)`` — the causal flag when the mask is plain causal, else the mask — and a
rescale. The backward (:class:`_FusedSinkAttention`) is the same kernel's backward given ``O'`` and ``L'``: its
probabilities ``exp(S - L')`` are the sink softmax's and its row term ``rowsum(dO · O')`` is the sink softmax's
too, so the q, k, v gradients are exact; the sink's gradient is ``-Σ exp(sink - L') · rowsum(dO · O')`` over the
batch and the queries. Grouped-query heads go to the kernel as they are (it supports them, forward and backward).
Under autocast the inputs are cast as SDPA would cast them; the rescale runs in fp32 (the kernel's ``L`` is fp32).

Anywhere else (CUDA, other dtypes) the sink runs inside SDPA as an explicit extra key column
(:func:`sdpa_with_sink_column`): the queries get one more dimension holding ``sink / scale``, the keys a zero there
and one extra key that is zero but for a one in it, the values a zero row for that key. That extra key's score is
exactly the sink logit, so the output is ``softmax([scores, sink])[..., :-1] @ v``, as transformers' GPT-OSS
``eager_attention_forward`` computes it; the gradients reach the sinks through the queries' extra dimension. It
costs about 1.7-2.3x plain causal attention on CPU (an explicit mask, one more column); the fused path 0.94-1.13x
(scripts/performance/sink_attention.py, on a shared 2-core machine; docs/performance.md).
"""

import torch
from torch.nn import functional as F


_FUSED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def sdpa_with_sink(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, sinks: torch.Tensor,
                   gqa: bool) -> torch.Tensor:
    """SDPA of ``q`` ``[n, heads, sq, d]`` over ``k``/``v`` ``[n, kv_heads, sk, d]`` under the boolean ``mask``
    (``[..., sq, sk]``, True = visible; None = plain causal, ``sq == sk``), with one sink logit per head (``sinks``
    ``[heads]``) joined to each query's softmax; scale ``1/sqrt(d)``. Returns ``[n, heads, sq, d]``.

    The fused CPU path (module docstring) when it applies, else :func:`sdpa_with_sink_column`."""
    if _fused_applies(q, k, v):
        q, k, v = _autocast_inputs(q, k, v)
        additive = None if mask is None else _additive_mask(mask, q.dtype)
        return _FusedSinkAttention.apply(q, k, v, sinks, additive)
    if mask is None:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    return sdpa_with_sink_column(q, k, v, mask, sinks, gqa)


def _fused_applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the fused CPU kernel takes these inputs: CPU tensors of one supported dtype, equal head widths."""
    return (all(t.device.type == "cpu" for t in (q, k, v)) and q.dtype in _FUSED_DTYPES
            and k.dtype == q.dtype and v.dtype == q.dtype and q.shape[-1] == k.shape[-1] == v.shape[-1])


def _autocast_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``q, k, v`` as CPU autocast hands them to SDPA (on its lower-precision list): in the autocast dtype when it is
    on, fp64 excepted; else as they are."""
    if not torch.is_autocast_enabled("cpu"):
        return q, k, v
    dtype = torch.get_autocast_dtype("cpu")
    return tuple(t if t.dtype == torch.float64 else t.to(dtype) for t in (q, k, v))


def _additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The boolean ``mask`` as the kernel's additive mask (0 visible, -inf hidden), as SDPA converts it."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


class _FusedSinkAttention(torch.autograd.Function):
    """The fused CPU flash kernel with its output rescaled by ``sigmoid(L - sink)``; backward through the kernel's
    own backward with the sink softmax's output and log-normalizer (module docstring)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor,  # noqa: ANN001
                mask: torch.Tensor | None) -> torch.Tensor:
        scale = q.shape[-1] ** -0.5
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, mask is None, attn_mask=mask, scale=scale)
        sink = sinks.detach().to(lse.dtype).view(1, -1, 1)
        lse_sink = torch.logaddexp(lse, sink)  # [n, heads, sq], fp32 (fp64 for fp64 inputs)
        weight = torch.exp(lse - lse_sink).unsqueeze(-1)  # sigmoid(L - sink)
        final = out * weight if out.dtype == weight.dtype else (out.to(weight.dtype) * weight).to(out.dtype)
        ctx.save_for_backward(q, k, v, final, lse_sink, sink, mask)
        ctx.scale = scale
        ctx.sinks_dtype = sinks.dtype
        return final

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # noqa: ANN001
        q, k, v, final, lse_sink, sink, mask = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, final, lse_sink, 0.0, mask is None, attn_mask=mask, scale=ctx.scale)
        dsinks = None
        if ctx.needs_input_grad[3]:
            row = (grad_out.to(torch.float32) * final.to(torch.float32)).sum(-1)  # rowsum(dO · O'), [n, heads, sq]
            dsinks = -(torch.exp(sink - lse_sink) * row).sum(dim=(0, 2)).to(ctx.sinks_dtype)
        return dq, dk, dv, dsinks, None


def sdpa_with_sink_column(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                          sinks: torch.Tensor, gqa: bool) -> torch.Tensor:
    """:func:`sdpa_with_sink` as SDPA with the sink as an explicit extra key column (module docstring): any device
    and dtype; ``mask`` boolean, required."""
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
