"""Activation memory of one rank: what autograd keeps per token of a decoder block, times tokens, blocks and the
micro-batches a pipeline schedule keeps in flight. Pure arithmetic (no torch).

Counted per token of one block of the local engine (``a`` = compute-dtype bytes, norms compute in fp32):

* the two RMSNorms (four with ``model.post_norms``) save their fp32 input and normalized output: ``2 × 2h × 4``
  bytes (divided by TP with sequence parallelism, whose norms see a sequence shard);
* attention: the q/k/v input ``h``, q, k, v as saved by ``scaled_dot_product_attention`` (``(nq + 2 nkv) d``;
  with all-gather CP (``cp_comm_type``) the gathered keys and values cover the whole sequence, ``× cp``), its
  output and the output projection's input copy (``2 nq d``), times ``a`` — head dimensions divide by TP;
* soft-capped attention (``model.attn_logit_softcapping``, Gemma 2) computes its scores in query blocks and
  recomputes them in the backward (``models/softcapping.py``): it keeps what SDPA keeps plus each local head's fp32
  log-sum-exp (4 bytes); one block's scores and their gradients are a transient workspace of the backward
  (``models/softcap_blocks.py``), counted in the peak in place of the output head's gradients when larger;
* multi-latent attention instead: its input, the latents, the up-projected keys/values, q, k, v, its output and the
  output projection's input (:func:`_mla_per_token`), plus the latent norms' fp32 input and output;
* MLP: its input ``h`` and, for SwiGLU, gate, silu(gate), up and their product (``4 f``; GELU ``2 f``), times ``a``;
  MoE layers route each token to ``moe_router_topk`` experts of width ``moe_ffn_hidden_size``: the token copies
  and the expert intermediates, the expert outputs in fp32 (the weighted sum), the router's fp32 scores and the int64
  routing indices (two more permutations with EP); under MoE parallel folding (ETP 1, EP > 1, TP > 1) each TP rank
  routes only its 1/TP of the tokens, so the routed terms divide by TP.

Recompute (``model.recompute_granularity``, else the backend's ``activation_checkpointing``): "full" keeps only each
block's input (residual dtype) plus one block recomputed during backward; ``recompute_method="block"`` does that for
the first ``recompute_num_layers`` blocks; "selective" (torchtitan's policy: attention output and every other matmul
saved) keeps input, q, v, attention output, gate and MLP output; MLP-only checkpointing keeps the MLP input only.
The output head adds the final norm, the output layer's input and the fp32 log-softmax of the logits (``4 V``) plus two
``4 V`` gradients at the start of backward (logits are full-vocabulary on every TP rank); with
``model.final_logit_softcapping`` the capped logits too (``a V``).

Under PP each rank is estimated on its own (its layers as the engine splits them, the embedding and the head where
it holds them) with the chunk-micro-batches its schedule keeps alive at once
(:func:`~megatron_bridge.perf.layout.chunks_in_flight`); each of them also keeps the stage's received input and
its output (``2 h`` per token in the residual dtype). ``model.cpu_offloading`` moves the first
``cpu_offloading_num_layers`` blocks' activations to host memory.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from megatron_bridge.engines.memory import DTYPE_BYTES
from megatron_bridge.models import softcap_blocks
from megatron_bridge.perf.layout import Layout, RankStages, cfg_get, chunks_in_flight, pipeline_ranks


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer


@dataclass
class ActivationEstimate:
    """Activation bytes of the largest rank."""

    layer_bytes: int
    """One block, one micro-batch, nothing recomputed."""
    stored_layer_bytes: int
    """One block, one micro-batch, as stored with the configured recompute (mean over the rank's blocks)."""
    in_flight: float
    """Micro-batches whose activations are alive at once on the rank, in units of the rank's whole layer stack
    (chunk-micro-batches / chunks)."""
    head_bytes: int
    """Final norm, output layer and loss of one micro-batch (0 on a rank without the last stage)."""
    peak_bytes: int
    """The activation peak on the device."""
    host_bytes: int = 0
    """Offloaded to host memory."""
    recompute: str = "none"
    notes: list[str] = field(default_factory=list)


def recompute_mode(cfg: "ConfigContainer", backend: str) -> tuple[str, int | None]:
    """("none" | "full" | "selective" | "mlp", blocks it applies to (None: all)), resolved as the backends do."""
    m = cfg.model
    if m.recompute_granularity is not None:
        blocks = m.recompute_num_layers if m.recompute_granularity == "full" and m.recompute_method == "block" else None
        return m.recompute_granularity, blocks
    if backend == "megatron_fsdp":
        return ("mlp", None) if cfg.ddp.megatron_fsdp_mlp_activation_checkpointing else ("none", None)
    section = cfg.fsdp2 if backend == "fsdp2" else cfg.ddp
    mode = section.activation_checkpointing
    if mode is True or mode == "full":
        return "full", None
    if mode == "selective":
        return "selective", None
    if backend == "fsdp2" and cfg.fsdp2.mlp_activation_checkpointing:
        return "mlp", None
    return "none", None


def _mla_per_token(m: Any, a: int, tp: int) -> tuple[float, float, float, float]:
    """Multi-latent attention's saved tensors per token (``models/mla.py``): the query and key widths (what
    ``nq``/``nkv`` mean for selective recompute), the attention bytes (its input, the latents with the shared RoPE key,
    ``kv_b_proj``'s output, q, k, v as SDPA saves them, its output and the output projection's input copy; head
    dimensions divide by TP) and the latent norms' fp32 input and output."""
    heads = m.num_attention_heads / tp
    qk, v = heads * (m.qk_head_dim + m.qk_pos_emb_head_dim), heads * m.v_head_dim
    q_rank = m.q_lora_rank or 0
    latents = q_rank + m.kv_lora_rank + m.qk_pos_emb_head_dim
    attn = a * (m.hidden_size + latents + heads * (m.qk_head_dim + m.v_head_dim) + 2 * qk + 3 * v)
    return qk, qk, attn, 8 * (q_rank + m.kv_lora_rank)


def _per_token(cfg: "ConfigContainer", layout: Layout, a: int, resid: int) -> dict[str, float]:
    """Bytes per token of one block: full, and as kept by each recompute mode."""
    m = cfg.model
    h, d, tp = m.hidden_size, m.head_dim, layout.tp
    nq, nkv = m.num_attention_heads * d / tp, m.num_kv_heads * d / tp
    sp = tp if layout.sequence_parallel else 1
    norms = 16 * h / sp * (2 if cfg_get(m, "post_norms", False) else 1) + (8 * (nq + nkv) if m.qk_layernorm else 0)
    gathered = layout.cp if cfg_get(m, "cp_comm_type", "all_gather") == "all_gather" else 1  # ring: one shard
    attn = a * (h + nq + 2 * nkv * gathered + 2 * nq) + _softcap_scores_per_token(m, layout, a)
    if cfg_get(m, "multi_latent_attention", False):
        nq, nkv, attn, latent_norms = _mla_per_token(m, a, tp)
        norms += latent_norms
    experts = int(cfg_get(m, "num_moe_experts", 0))
    f = m.ffn_hidden_size / tp
    width = 4 if m.gated_linear_unit else 2
    if experts:
        k = int(cfg_get(m, "moe_router_topk", 2))
        fe = int(cfg_get(m, "moe_ffn_hidden_size", m.ffn_hidden_size)) / layout.etp
        fs = int(cfg_get(m, "moe_shared_expert_intermediate_size", 0)) / tp
        # the gathered token copies, the expert intermediates, the expert outputs kept in fp32 for the weighted
        # sum, and the int64 routing indices, order and token map (+ the two EP permutations); under MoE parallel
        # folding (ETP 1, EP and TP > 1) each TP rank routes 1/TP of the tokens
        routed = a / tp if layout.splits_tokens_over_tp else a
        indices = 8 * k * (3 + (2 if layout.ep > 1 else 0))
        mlp = a * (h + width * fs) + routed * k * (h + width * fe) + (4 * k * h + 8 * experts + indices) * routed / a
        gate = a * k * fe
    else:
        mlp = a * (h + width * f)
        gate = a * f
    full = norms + attn + mlp
    block_input = resid * h / sp
    return {
        "none": full,
        "full": block_input,
        "selective": block_input + a * (2 * nq + nkv * gathered + h / sp) + gate,
        "mlp": norms + attn + a * h,
    }


def _softcap_scores_per_token(m: Any, layout: Layout, a: int) -> float:
    """Bytes per token soft-capped attention keeps beyond what SDPA keeps: the fp32 log-sum-exp of each local head
    (module docstring); 0 without a cap."""
    if cfg_get(m, "attn_logit_softcapping", None) is None or cfg_get(m, "multi_latent_attention", False):
        return 0.0
    return 4.0 * m.num_attention_heads / layout.tp


def _device_type(cfg: "ConfigContainer") -> str:
    """The device the estimate is for: CPU for a gloo run (``dist.distributed_backend``), else a GPU."""
    return "cpu" if cfg_get(cfg.dist, "distributed_backend", None) == "gloo" else "cuda"


def _softcap_workspace(m: Any, layout: Layout, device_type: str) -> int:
    """Bytes of soft-capped attention's transient block workspace in the backward (module docstring): the widest
    layer's, a full layer over the (gathered) sequence, or a window layer over its ``2 W`` keys in blocks of ``W``
    queries, with ``device_type``'s block rows; 0 without a cap. It is not alive together with the output head's
    gradients (counted instead of them)."""
    if cfg_get(m, "attn_logit_softcapping", None) is None or cfg_get(m, "multi_latent_attention", False):
        return 0
    s, heads, mb = layout.seq_length, m.num_attention_heads // layout.tp, layout.micro_batch_size
    device = "cpu" if device_type == "cpu" else "cuda"
    sizes = []
    for w in {m.attention_window(i) for i in range(m.num_layers)}:
        if w is not None and s >= 2 * w and layout.cp == 1:  # the blocked window path: [mb × blocks, heads, W, 2W]
            sizes.append(softcap_blocks.workspace_bytes(mb * -(-s // w), heads, w, 2 * w, device))
        else:
            sizes.append(softcap_blocks.workspace_bytes(mb, heads, s // layout.cp, s, device))
    return max(sizes)


def estimate_activations(cfg: "ConfigContainer", layout: Layout, rank: RankStages | None = None
                         ) -> ActivationEstimate:
    """Activation bytes of one pipeline rank (default: the first); see the module docstring."""
    m = cfg.model
    rank = rank or pipeline_ranks(cfg, layout)[0]
    mp = cfg.mixed_precision_config
    a = DTYPE_BYTES[mp.compute_dtype] if mp is not None and (mp.bf16 or mp.fp16) else DTYPE_BYTES[m.params_dtype]
    resid = DTYPE_BYTES[m.params_dtype] if layout.backend == "ddp" else a  # DDP autocast keeps an fp32 stream
    tokens = layout.tokens_per_microbatch
    per = _per_token(cfg, layout, a, resid)
    mode, blocks = recompute_mode(cfg, layout.backend)
    n = len(rank.layers)

    def stored(count: int) -> float:
        if mode == "none":
            return count * per["none"]
        k = count if blocks is None else min(count, blocks)
        return k * per[mode] + (count - k) * per["none"]

    offloaded = min(n, m.cpu_offloading_num_layers) if m.cpu_offloading and m.cpu_offloading_activations else 0
    recompute_tmp = per["none"] if mode != "none" else 0.0
    v = m.padded_vocab_size
    head = 8 * m.hidden_size + a * m.hidden_size + 12 * v + (a * v if a < 4 else 0) if rank.last else 0.0
    if rank.last and cfg_get(m, "final_logit_softcapping", None) is not None:
        head += a * v  # the capped logits (tanh's output, kept for its backward)
    live_chunks = chunks_in_flight(layout, rank.pp_rank)
    in_flight = live_chunks / rank.chunks
    boundary = live_chunks * 2 * resid * m.hidden_size if layout.pp > 1 else 0.0  # stage input and output kept
    peak = in_flight * (stored(n) - offloaded * per["none"]) + recompute_tmp + boundary
    transient = max(head * tokens, _softcap_workspace(m, layout, _device_type(cfg)) if n else 0)
    notes = []
    if offloaded:
        notes.append(f"model.cpu_offloading: activations of the first {offloaded} block(s) live in host memory")
    return ActivationEstimate(
        layer_bytes=int(per["none"] * tokens), stored_layer_bytes=int(stored(n) / max(n, 1) * tokens),
        in_flight=in_flight, head_bytes=int(head * tokens),
        peak_bytes=int(peak * tokens + transient),
        host_bytes=int(in_flight * offloaded * per["none"] * tokens), recompute=mode, notes=notes,
    )
