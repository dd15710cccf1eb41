"""Parameter and training-FLOP counts of the Llama-family decoder built by :class:`LlamaModel` (dense and MoE)."""

from dataclasses import dataclass

from megatron_bridge.config.model import ModelConfig


@dataclass(frozen=True)
class ParameterBreakdown:
    """Parameter counts of the model built from a config, by part (the memory model shards each part its own way)."""

    embedding: int
    """The input embedding ``[padded_vocab, hidden]``."""
    output: int
    """The output layer (``lm_head``); 0 when tied to the embedding."""
    layer_attention: int
    """One decoder block without its MLP: its norms (two, four with post_norms), the q/k/v/o projections (biases, q/k
    norms)."""
    layer_attention_norms: int
    """Of ``layer_attention``: the norm weights (replicated over tensor-parallel ranks)."""
    layer_mlp: int
    """One block's dense MLP (SwiGLU: gate, up, down); MoE layers have :func:`moe_mlp_parameters` instead."""
    final_norm: int
    """The final norm."""
    num_layers: int
    """Decoder blocks."""

    @property
    def layer(self) -> int:
        """One decoder block."""
        return self.layer_attention + self.layer_mlp

    @property
    def total(self) -> int:
        """Every parameter."""
        return self.embedding + self.output + self.num_layers * self.layer + self.final_norm


def parameter_breakdown(config: ModelConfig) -> ParameterBreakdown:
    """Parameter counts by part of the model built from ``config`` (the padded vocabulary, as built)."""
    h, f, d = config.hidden_size, config.ffn_hidden_size, config.head_dim
    nq, nkv = config.num_attention_heads, config.num_kv_heads
    norm = 2 * h if config.normalization == "LayerNorm" else h
    layer_norms = (4 if config.post_norms else 2) * norm

    attn = h * nq * d + 2 * h * nkv * d + nq * d * h
    if config.add_qkv_bias:
        attn += nq * d + 2 * nkv * d
    if config.has_attention_output_bias:
        attn += h
    qk_norms = 2 * d if config.qk_layernorm else 0
    if config.multi_latent_attention:
        attn, qk_norms = mla_projection_parameters(config), mla_norm_parameters(config)
    sinks = nq if config.softmax_type == "learnable" else 0  # one per head; TP keeps them whole (rule attention_sinks)

    n_fc1 = 2 if config.gated_linear_unit else 1
    mlp = n_fc1 * h * f + f * h
    if config.add_bias_linear:
        mlp += n_fc1 * f + h
    vocab = config.padded_vocab_size
    return ParameterBreakdown(
        embedding=vocab * h, output=0 if config.share_embeddings_and_output_weights else vocab * h,
        layer_attention=layer_norms + attn + qk_norms + sinks, layer_attention_norms=layer_norms + qk_norms + sinks,
        layer_mlp=mlp,
        final_norm=norm, num_layers=config.num_layers,
    )


def mla_projection_parameters(config: ModelConfig) -> int:
    """The projection weights of one multi-latent attention (``models/mla.py``): the query path (``q_proj``, or
    ``q_a_proj`` and ``q_b_proj``), ``kv_a_proj_with_mqa``, ``kv_b_proj`` and ``o_proj``."""
    h, nq, q_rank, kv_rank = config.hidden_size, config.num_attention_heads, config.q_lora_rank, config.kv_lora_rank
    qk, rope, v = config.qk_head_dim + config.qk_pos_emb_head_dim, config.qk_pos_emb_head_dim, config.v_head_dim
    q = h * nq * qk if q_rank is None else h * q_rank + q_rank * nq * qk
    return q + h * (kv_rank + rope) + kv_rank * nq * (config.qk_head_dim + v) + nq * v * h


def mla_norm_parameters(config: ModelConfig) -> int:
    """The latent norms of one multi-latent attention (``q_a_layernorm`` when there is a query latent,
    ``kv_a_layernorm``): replicated over tensor-parallel ranks like the other norms."""
    return (config.q_lora_rank or 0) + config.kv_lora_rank


def _mla_forward_flops(config: ModelConfig, attention_keys: int, layers: int | None = None) -> float:
    """Forward matmul FLOPs per token of ``layers`` (default: every) layers' multi-latent attention: its projections
    (:func:`mla_projection_parameters`, ``2`` per weight) and the scores and values over ``attention_keys`` keys summed
    over the layers (``2 * nq * (qk_head_dim + qk_pos_emb_head_dim)`` and ``2 * nq * v_head_dim`` per key)."""
    nq = config.num_attention_heads
    qk = config.qk_head_dim + config.qk_pos_emb_head_dim
    layers = config.num_layers if layers is None else layers
    return layers * 2 * mla_projection_parameters(config) + 2 * nq * (qk + config.v_head_dim) * attention_keys


def moe_mlp_parameters(config: ModelConfig, experts: int | None = None) -> int:
    """Parameters of one MoE layer's MLP: router ``E*h``, ``experts`` routed SwiGLU experts (default: all
    ``num_moe_experts``) and the shared expert."""
    h, f = config.hidden_size, config.expert_ffn_hidden_size
    e = config.num_moe_experts or 0
    shared = config.moe_shared_expert_intermediate_size or 0
    return e * h + (e if experts is None else experts) * 3 * h * f + 3 * h * shared


def num_parameters(config: ModelConfig, *, include_embedding: bool = True, active_only: bool = False) -> int:
    """Number of parameters of the model built from ``config`` (equals ``sum(p.numel())`` of the built model).

    Args:
        config: the model config (the vocabulary is the padded one, as built).
        include_embedding: when False, leave out the input embedding and the output layer (``lm_head``), i.e. count
            the decoder blocks and the final norm only.
        active_only: for MoE models, count only the ``moe_router_topk`` routed experts a token uses per MoE layer
            (the "A3B" of Qwen3-30B-A3B); the router and shared expert count whole.
    """
    parts = parameter_breakdown(config)
    total = parts.total
    n_moe = sum(config.moe_layer_pattern())
    experts = config.moe_router_topk if active_only else None
    if n_moe:
        total += n_moe * (moe_mlp_parameters(config, experts) - parts.layer_mlp)
    if config.mtp_depths:  # each depth: enorm, hnorm, final norm, eh_proj [h, 2h] and a layer like the last one
        last_mlp = moe_mlp_parameters(config, experts) if config.moe_layer_pattern()[-1] else parts.layer_mlp
        total += config.mtp_depths * (3 * parts.final_norm + 2 * config.hidden_size ** 2 + parts.layer_attention
                                      + last_mlp)
    if include_embedding:
        return total
    return total - parts.embedding - parts.output


def num_floating_point_operations(config: ModelConfig, batch_size: int, seq_length: int | None = None) -> float:
    """Training FLOPs of one iteration over ``batch_size`` sequences: forward + backward = 3x forward matmul FLOPs.

    Counted (``2*m*n*k`` per matmul, per token, times ``batch_size * seq_length`` tokens):

    * q/k/v/o projections with grouped-query attention: ``2*h*d*(2*nq + 2*nkv)``; multi-latent attention counts its
      own projections and head widths (:func:`_mla_forward_flops`);
    * attention scores ``Q K^T`` and attention over values: ``2 * (2*k*d*nq)`` over ``k`` keys per query. With full
      attention ``k = s``: the full ``s x s`` matrix is counted, not the causal half: that is what the kernels compute
      (the mask is applied to a full product in the math path) and what Megatron's classic formula and
      ``torch.utils.flop_counter`` count. A sliding-window layer (:meth:`ModelConfig.attention_window`) counts only
      the attended keys, ``k = min(W, s)`` (what a banded kernel computes); attention sinks
      (``model.softmax_type``) add one key per query, the sink column the SDPA path computes;
    * MLP: 3 matmuls ``h x f`` for SwiGLU, 2 for GELU;
    * MoE layers (``config.moe_layer_pattern()``): the router ``2*h*E`` plus only the **active** experts,
      ``moe_router_topk`` SwiGLU experts ``3 * 2*h*moe_ffn_hidden_size``, plus the shared expert
      ``3 * 2*h*moe_shared_expert_intermediate_size`` (Megatron's MoE FLOPs formula);
    * logits: ``2*h*padded_vocab``;
    * multi-token prediction (``mtp_num_layers`` depths, megatron-core's formula): per depth ``eh_proj``
      ``2*2h*h``, one layer like the last one (its attention over its keys, its MLP or MoE) and the logits again.

    Not counted: norms, RoPE, softmax, activations, bias adds, the loss and the embedding lookup. Backward is twice
    the forward (input- and weight-gradient matmuls), hence the factor 3.

    Args:
        config: the model config.
        batch_size: sequences per iteration (global batch for the whole job, micro-batch for one step of one rank).
        seq_length: tokens per sequence; None means ``config.seq_length``.
    """
    s = config.seq_length if seq_length is None else seq_length
    h, f, d = config.hidden_size, config.ffn_hidden_size, config.head_dim
    nq, nkv = config.num_attention_heads, config.num_kv_heads

    projections = 2 * h * d * (2 * nq + 2 * nkv)
    attention_keys = sum(min(config.attention_window(i) or s, s) for i in range(config.num_layers))
    if config.softmax_type != "vanilla":
        attention_keys += config.num_layers  # the sink column, one more key per query as SDPA computes it
    mlp = (3 if config.gated_linear_unit else 2) * 2 * h * f
    n_moe = sum(config.moe_layer_pattern())
    moe_mlp = 0
    if n_moe:
        e, fe = config.num_moe_experts or 0, config.expert_ffn_hidden_size
        shared = config.moe_shared_expert_intermediate_size or 0
        moe_mlp = 2 * h * e + config.moe_router_topk * 3 * 2 * h * fe + 3 * 2 * h * shared
    logits = 2 * h * config.padded_vocab_size
    attention = config.num_layers * projections + 2 * 2 * d * nq * attention_keys
    if config.multi_latent_attention:
        attention = _mla_forward_flops(config, attention_keys)
    forward_per_token = (attention + (config.num_layers - n_moe) * mlp
                         + n_moe * moe_mlp + logits)
    if config.mtp_depths:
        last = config.num_layers - 1
        keys = min(config.attention_window(last) or s, s) + (1 if config.softmax_type != "vanilla" else 0)
        layer_attention = projections + 2 * 2 * d * nq * keys
        if config.multi_latent_attention:
            layer_attention = _mla_forward_flops(config, keys, layers=1)
        last_mlp = moe_mlp if config.moe_layer_pattern()[last] else mlp
        forward_per_token += config.mtp_depths * (2 * 2 * h * h + layer_attention + last_mlp + logits)
    return float(3 * forward_per_token * batch_size * s)
