"""Multi-latent attention (MLA, DeepSeek-V2/V3): the attention block of ``model.multi_latent_attention``.

Per token ``x`` (``[b, s, hidden]``), with ``H`` heads, ``dn = qk_head_dim`` (no-RoPE part), ``dr =
qk_pos_emb_head_dim`` (RoPE part), ``dv = v_head_dim``:

* queries: ``q_b_proj(q_a_layernorm(q_a_proj(x)))`` through a ``q_lora_rank`` latent, or ``q_proj(x)`` when
  ``q_lora_rank`` is None; ``[b, s, H, dn + dr]``, split into ``q_nope`` and ``q_rope``;
* keys and values: ``kv_a_proj_with_mqa(x)`` is ``[c_kv (kv_lora_rank), k_rope (dr)]``; ``k_rope`` is one RoPE key
  head shared by all heads; ``kv_b_proj(kv_a_layernorm(c_kv))`` is ``[b, s, H, dn + dv]`` = per-head ``k_nope`` and
  the values;
* RoPE on ``q_rope`` and ``k_rope`` only, in DeepSeek's interleaved pairs ``(x0, x1), (x2, x3), ...`` as Hugging
  Face's ``apply_rotary_pos_emb_interleave`` applies them (the rotated pairs come out de-interleaved, evens then odds,
  for queries and keys alike, so the dot products are those of the interleaved rotation; megatron-core's MLA does the
  same);
* causal attention of ``[q_nope, q_rope]`` over ``[k_nope, k_rope]`` (width ``dn + dr``) with values of width ``dv``,
  softmax scale ``(dn + dr) ** -0.5`` times ``mscale(yarn_rotary_scaling_factor, yarn_mscale_all_dim) ** 2`` with
  YaRN (:func:`mla_softmax_scale`), as Hugging Face's ``yarn_apply_mscale`` and megatron-core's MLA;
* ``o_proj`` from ``H × dv`` back to ``hidden``.

Module names follow Hugging Face's ``DeepseekV3Attention`` (:data:`megatron_bridge.config.decoder_names.MLA_MODULES`),
so checkpoints map one-to-one. Tensor parallelism (:meth:`MultiLatentAttention.tensor_parallel_styles`): the
head-producing projections (``q_proj`` or ``q_b_proj``, ``kv_b_proj``) column-wise, ``o_proj`` row-wise, the latent
down-projections and their norms replicated over the TP group (as megatron-core keeps ``linear_q_down_proj`` and
``linear_kv_down_proj`` whole on every TP rank); the reshapes read the local head count from the tensors. The shared
RoPE key feeds only the rank's heads, so its gradient is summed over the TP group (:func:`_shared_over_tp`).
Context parallelism runs the shared all-gather CP attention (queries pre-scaled); ring attention
(``cp_comm_type="p2p"``) and sliding windows are not built with MLA (rule ``multi_latent_attention``).
"""

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.nn import functional as F

from megatron_bridge.config import decoder_names as n
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.models.layers import RMSNorm, yarn_mscale


Linear = Callable[..., nn.Linear]


def mla_softmax_scale(config: ModelConfig) -> float:
    """``(qk_head_dim + qk_pos_emb_head_dim) ** -0.5``, times ``yarn_mscale(factor, yarn_mscale_all_dim) ** 2`` with
    YaRN and a nonzero yarn_mscale_all_dim (megatron-core's and Hugging Face's MLA softmax scale)."""
    scale = (config.qk_head_dim + config.qk_pos_emb_head_dim) ** -0.5
    if config.position_embedding_type == "yarn" and config.yarn_mscale_all_dim:
        mscale = yarn_mscale(config.yarn_rotary_scaling_factor, config.yarn_mscale_all_dim)
        scale *= mscale * mscale
    return scale


def rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE over interleaved pairs of ``x`` (``[b, heads, s, d]``): pair ``(x[2i], x[2i+1])`` rotated by angle ``i``;
    returns ``[rotated evens, rotated odds]`` (Hugging Face's ``apply_rotary_pos_emb_interleave``). ``cos``/``sin``
    are ``[b, 1, s, d]`` (``cat(freqs, freqs)``: the first half holds the angles). Computed in float32."""
    half = cos.shape[-1] // 2
    cos, sin = cos[..., :half], sin[..., :half]
    x32 = x.float()
    x1, x2 = x32[..., 0::2], x32[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def _shared_over_tp(t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``t`` unchanged; under tensor parallelism (``weight`` is a DTensor on the TP mesh) its gradient is summed over
    the TP group: ``t`` is replicated, but each rank's heads use it, so each rank's gradient is a part."""
    if not isinstance(weight, DTensor):
        return t
    mesh = weight.device_mesh
    tp_dim = mesh.mesh_dim_names.index("tp") if mesh.mesh_dim_names and "tp" in mesh.mesh_dim_names else 0
    if not isinstance(weight.placements[tp_dim], Shard):
        return t  # heads not split (a custom plan that replicates MLA): every rank's gradient is whole
    if mesh.ndim > 1:
        mesh = mesh["tp"]
    return DTensor.from_local(t, mesh, (Replicate(),), run_check=False).to_local(grad_placements=(Partial(),))


class MultiLatentAttention(nn.Module):
    """Multi-latent attention (module docstring), built on the meta device like the shared decoder's blocks."""

    def __init__(self, config: ModelConfig, *, dtype: torch.dtype, linear: Linear) -> None:
        super().__init__()
        h, heads = config.hidden_size, config.num_attention_heads
        self.nope_dim, self.rope_dim, self.v_dim = config.qk_head_dim, config.qk_pos_emb_head_dim, config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        self.q_lora_rank = config.q_lora_rank
        self.softmax_scale = mla_softmax_scale(config)
        qk = self.nope_dim + self.rope_dim
        eps = config.layernorm_epsilon
        if self.q_lora_rank is None:
            self.q_proj = linear(h, heads * qk, False, dtype=dtype)
        else:
            self.q_a_proj = linear(h, self.q_lora_rank, False, dtype=dtype)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, eps, device="meta", dtype=dtype)
            self.q_b_proj = linear(self.q_lora_rank, heads * qk, False, dtype=dtype)
        self.kv_a_proj_with_mqa = linear(h, self.kv_lora_rank + self.rope_dim, False, dtype=dtype)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, eps, device="meta", dtype=dtype)
        self.kv_b_proj = linear(self.kv_lora_rank, heads * (self.nope_dim + self.v_dim), False, dtype=dtype)
        self.o_proj = linear(heads * self.v_dim, h, False, dtype=dtype, output_projection=True)
        self.context_parallel: Callable[..., torch.Tensor] | None = None
        """Set by ``apply_context_parallel`` (CP > 1): causal attention of the local zig-zag queries over the whole
        sequence (the all-gather path of :class:`megatron_bridge.distributed.cp_attention.ContextParallelAttention`,
        which uses SDPA's default scale: the queries come pre-scaled, :meth:`_core_attention`)."""

    def tensor_parallel_styles(self) -> dict[str, str]:
        """Submodule name → TP style name (``"colwise"``, ``"rowwise"``, ``"replicate"``) of the auto TP plan: heads
        split over the TP group, the latent down-projections and their norms replicated (module docstring)."""
        if self.q_lora_rank is None:
            styles = {n.Q_PROJ: "colwise"}
        else:
            styles = {n.MLA_Q_DOWN: "replicate", n.MLA_Q_NORM: "replicate", n.MLA_Q_UP: "colwise"}
        return {**styles, n.MLA_KV_DOWN: "replicate", n.MLA_KV_NORM: "replicate", n.MLA_KV_UP: "colwise",
                n.O_PROJ: "rowwise"}

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if self.q_lora_rank is None:
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))

    def _core_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal SDPA with the MLA softmax scale; under CP the queries are multiplied by ``softmax_scale *
        sqrt(q width)`` so that the CP attention's default ``1 / sqrt(q width)`` gives the same scale."""
        if self.context_parallel is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
        return self.context_parallel(q * (self.softmax_scale * math.sqrt(q.shape[-1])), k, v)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x``: ``[b, s, hidden]``; ``cos``/``sin``: ``[b, 1, s, qk_pos_emb_head_dim]``. Returns
        ``[b, s, hidden]``. The head count is read from the projections' outputs (the local heads under TP)."""
        b, s, _ = x.shape
        q = self._queries(x).view(b, s, -1, self.nope_dim + self.rope_dim).transpose(1, 2)
        q_nope, q_rope = torch.split(q, [self.nope_dim, self.rope_dim], dim=-1)
        c_kv, k_rope = torch.split(self.kv_a_proj_with_mqa(x), [self.kv_lora_rank, self.rope_dim], dim=-1)
        k_rope = _shared_over_tp(k_rope, self.kv_b_proj.weight).reshape(b, 1, s, self.rope_dim)
        kv = self.kv_b_proj(self.kv_a_layernorm(c_kv)).view(b, s, -1, self.nope_dim + self.v_dim).transpose(1, 2)
        k_nope, v = torch.split(kv, [self.nope_dim, self.v_dim], dim=-1)
        q_rope, k_rope = rotate_interleaved(q_rope, cos, sin), rotate_interleaved(k_rope, cos, sin)
        heads = k_nope.shape[1]
        q = torch.cat([q_nope, q_rope], dim=-1)
        k = torch.cat([k_nope, k_rope.expand(-1, heads, -1, -1)], dim=-1)
        out = self._core_attention(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, heads * self.v_dim))


__all__ = ["MultiLatentAttention", "mla_softmax_scale", "rotate_interleaved"]
