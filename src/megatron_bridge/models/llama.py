"""A Llama-family decoder-only transformer in plain PyTorch (the "local" engine).

Module and parameter names follow Hugging Face's ``LlamaForCausalLM`` (``embed_tokens``, ``layers.N.self_attn.q_proj``,
``mlp.gate_proj``, ``norm``, ``lm_head``) so checkpoints map one-to-one. The model runs unchanged on CPU and CUDA and
in float32, bfloat16 and float16 (``model.to(dtype)``); norms, RoPE and the loss compute in float32.
"""

import math
from collections.abc import Callable
from contextlib import nullcontext

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn import functional as F

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import MegatronBridgeError
from megatron_bridge.models.attention import causal_attention
from megatron_bridge.models.layers import LayerNorm, RMSNorm, RotaryEmbedding, apply_rotary_pos_emb, build_norm
from megatron_bridge.models.mla import MultiLatentAttention
from megatron_bridge.models.moe import GroupedExperts, MoELayer, TopKRouter, quick_gelu
from megatron_bridge.models.mtp import MultiTokenPrediction
from megatron_bridge.models.softcapping import softcap
from megatron_bridge.models.validation import validate_model_config
from megatron_bridge.utils.logging import get_logger, warn_once


logger = get_logger(__name__)

_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

_OUTPUT_PROJECTION = "_megatron_bridge_output_projection"
"""Attribute set on the Linear layers that write into the residual stream (o_proj, down_proj)."""


def params_dtype_of(config: ModelConfig) -> torch.dtype:
    """The torch dtype named by ``config.params_dtype``."""
    return _DTYPES[config.params_dtype]


def _linear(
    in_features: int, out_features: int, bias: bool, *, dtype: torch.dtype, output_projection: bool = False
) -> nn.Linear:
    # Built on the meta device: no memory, no RNG draws; LlamaModel materializes and initializes everything at once.
    layer = nn.Linear(in_features, out_features, bias=bias, device="meta", dtype=dtype)
    if output_projection:
        setattr(layer, _OUTPUT_PROJECTION, True)
    return layer


class LlamaAttention(nn.Module):
    """Causal self-attention with grouped-query heads, optional per-head q/k RMSNorm and rotary embeddings, over the
    whole causal prefix or a sliding window (``window``: tokens including the current one; None: full)."""

    def __init__(self, config: ModelConfig, *, dtype: torch.dtype, window: int | None = None) -> None:
        super().__init__()
        self.window = window
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        h, d = config.hidden_size, self.head_dim
        self.q_proj = _linear(h, self.num_heads * d, config.add_qkv_bias, dtype=dtype)
        self.k_proj = _linear(h, self.num_kv_heads * d, config.add_qkv_bias, dtype=dtype)
        self.v_proj = _linear(h, self.num_kv_heads * d, config.add_qkv_bias, dtype=dtype)
        self.o_proj = _linear(self.num_heads * d, h, config.has_attention_output_bias, dtype=dtype,
                              output_projection=True)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_layernorm:
            zero = config.layernorm_zero_centered_gamma
            self.q_norm = RMSNorm(d, config.layernorm_epsilon, device="meta", dtype=dtype, zero_centered=zero)
            self.k_norm = RMSNorm(d, config.layernorm_epsilon, device="meta", dtype=dtype, zero_centered=zero)
        scale = config.softmax_scale
        self.query_scale = 1.0 if scale is None else scale * math.sqrt(d)
        """Factor on the queries after RoPE, so that SDPA's own ``1/sqrt(head_dim)`` makes ``model.softmax_scale``."""
        self.sinks: nn.Parameter | None = None
        """Per-head sink logits (``model.softmax_type="learnable"``); "off-by-one" uses the zeros buffer
        ``zero_sinks`` instead."""
        if config.softmax_type == "learnable":
            self.sinks = nn.Parameter(torch.empty(self.num_heads, device="meta", dtype=dtype))
        elif config.softmax_type == "off-by-one":
            self.register_buffer("zero_sinks", torch.zeros(self.num_heads, device="meta", dtype=dtype),
                                 persistent=False)
        self.softcap = config.attn_logit_softcapping
        """Soft-capping of the attention scores (``model.attn_logit_softcapping``, Gemma 2); None: none."""
        self.context_parallel: Callable[..., torch.Tensor] | None = None
        """Set by ``apply_context_parallel`` (CP > 1): causal attention of the local zig-zag queries over the whole
        sequence (:class:`megatron_bridge.distributed.cp_attention.ContextParallelAttention`)."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x``: ``[b, s, hidden]``; ``cos``/``sin``: ``[b, 1, s, head_dim]``. Returns ``[b, s, hidden]``."""
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary_pos_emb(q, cos, sin), apply_rotary_pos_emb(k, cos, sin)
        if self.query_scale != 1.0:
            q = q * self.query_scale
        if self.context_parallel is not None:
            out = self.context_parallel(q, k, v, window=self.window, sinks=self._sink_logits(),
                                        softcap=self.softcap)
        else:
            out = causal_attention(q, k, v, self.window, sinks=self._sink_logits(), softcap=self.softcap)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim))


    def reset_parameters(self) -> None:
        """Zero the sinks, the attention's own parameter (its projections and norms reset themselves)."""
        with torch.no_grad():
            if self.sinks is not None:
                self.sinks.zero_()
            if hasattr(self, "zero_sinks"):
                self.zero_sinks.zero_()

    def _sink_logits(self) -> torch.Tensor | None:
        """This rank's heads' sink logits (tensor parallelism splits the ``sinks`` over the heads as a DTensor)."""
        sinks = self.sinks if self.sinks is not None else getattr(self, "zero_sinks", None)
        return sinks.to_local() if isinstance(sinks, DTensor) else sinks


class LlamaMLP(nn.Module):
    """Feed-forward block: SwiGLU ``down(silu(gate(x)) * up(x))``, GeGLU ``down(gelu_tanh(gate(x)) * up(x))`` or
    GELU ``down(gelu(up(x)))``."""

    def __init__(self, config: ModelConfig, *, dtype: torch.dtype) -> None:
        super().__init__()
        h, f, bias = config.hidden_size, config.ffn_hidden_size, config.add_bias_linear
        self.gated = config.gated_linear_unit
        self.gate_act: Callable[[torch.Tensor], torch.Tensor] = \
            {"geglu": _gelu_tanh, "quick_geglu": quick_gelu}.get(config.activation, F.silu)
        self.gate_proj: nn.Linear | None = _linear(h, f, bias, dtype=dtype) if self.gated else None
        self.up_proj = _linear(h, f, bias, dtype=dtype)
        self.down_proj = _linear(f, h, bias, dtype=dtype, output_projection=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, s, hidden] -> [b, s, hidden]``."""
        if self.gate_proj is not None:
            return self.down_proj(self.gate_act(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(F.gelu(self.up_proj(x)))


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class LlamaDecoderLayer(nn.Module):
    """One pre-norm decoder block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``; the MLP is a
    :class:`~megatron_bridge.models.moe.MoELayer` on the layers ``config.moe_layer_pattern()`` marks. With
    ``config.post_norms`` (Gemma) the attention's and the MLP's outputs are normalized too before each residual add:
    ``x + post_norm(attn(norm(x)))``."""

    def __init__(self, config: ModelConfig, layer_idx: int, *, dtype: torch.dtype) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.uses_local_rope = config.rotary_base_local is not None and config.attention_window(layer_idx) is not None
        """Whether this layer takes the window layers' RoPE (``model.rotary_base_local``)."""
        self.input_layernorm = build_norm(config, config.hidden_size, device="meta", dtype=dtype)
        self.self_attn: LlamaAttention | MultiLatentAttention
        if config.multi_latent_attention:
            self.self_attn = MultiLatentAttention(config, dtype=dtype, linear=_linear)
        else:
            self.self_attn = LlamaAttention(config, dtype=dtype, window=config.attention_window(layer_idx))
        self.post_self_attn_layernorm: nn.Module | None = None
        self.post_mlp_layernorm: nn.Module | None = None
        if config.post_norms:
            self.post_self_attn_layernorm = build_norm(config, config.hidden_size, device="meta", dtype=dtype)
        self.post_attention_layernorm = build_norm(config, config.hidden_size, device="meta", dtype=dtype)
        self.mlp: LlamaMLP | MoELayer
        if config.moe_layer_pattern()[layer_idx]:
            self.mlp = MoELayer(config, dtype=dtype, linear=_linear)
        else:
            self.mlp = LlamaMLP(config, dtype=dtype)
        if config.post_norms:
            self.post_mlp_layernorm = build_norm(config, config.hidden_size, device="meta", dtype=dtype)

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``[b, s, hidden] -> [b, s, hidden]``."""
        attn = self.self_attn(self.input_layernorm(hidden_states), cos, sin)
        if self.post_self_attn_layernorm is not None:
            attn = self.post_self_attn_layernorm(attn)
        hidden_states = hidden_states + attn
        mlp = self.mlp(self.post_attention_layernorm(hidden_states))
        if self.post_mlp_layernorm is not None:
            mlp = self.post_mlp_layernorm(mlp)
        return hidden_states + mlp


class LlamaModel(nn.Module):
    """Llama-family decoder-only language model built from a :class:`ModelConfig`.

    Construction on a real device initializes the weights (:meth:`init_weights`, deterministic for a given torch
    seed); construction on the meta device (``device="meta"`` or under ``with torch.device("meta")``) leaves them
    uninitialized for a wrapper to materialize with ``to_empty(device=...)`` followed by :meth:`init_weights`.
    Weights are stored in ``config.params_dtype`` (initialized in float32, then rounded).

    CPU activation offloading (``config.cpu_offloading`` with ``cpu_offloading_activations``) runs the first
    ``cpu_offloading_num_layers`` blocks under ``torch.autograd.graph.save_on_cpu``. Weight offloading
    (``cpu_offloading_weights``) is not supported by the local engine and raises ``ConfigValidationError``.

    Args:
        config: the architecture; ``config.transformer_impl`` must be ``"local"``.
        device: where to build; None means torch's current default device.

    Raises:
        ConfigValidationError: a field cannot form a model, or the engine is not wired in this version.
        MissingDependencyError: a GPU engine was asked for and its package is missing.
    """

    _no_split_modules = ["LlamaDecoderLayer"]

    def __init__(self, config: ModelConfig, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        validate_model_config(config)
        self.config = config
        dtype = params_dtype_of(config)
        target = torch.device(device) if device is not None else torch.get_default_device()

        # A pipeline stage (megatron_bridge.models.pipeline_stage) drops the embedding, the final norm and output
        # layer where it does not hold them and keeps its layers in a ModuleDict keyed by global layer index.
        self.embed_tokens: nn.Embedding | None = nn.Embedding(config.padded_vocab_size, config.hidden_size,
                                                              device="meta", dtype=dtype)
        self.embeds_input = True
        """Whether the input is token ids for ``embed_tokens`` (False on pipeline stages after the first, among them
        a tied last stage that keeps ``embed_tokens`` only as its output weight)."""
        self.rotary_emb = RotaryEmbedding(config, device="meta")
        self.layers: nn.ModuleList | nn.ModuleDict = nn.ModuleList(
            LlamaDecoderLayer(config, i, dtype=dtype) for i in range(config.num_layers))
        self.norm: nn.Module | None = build_norm(config, config.hidden_size, device="meta", dtype=dtype)
        self.stage_output_dtype: torch.dtype | None = None
        """Pipeline stages without the output layer cast their output to this dtype (``model.pipeline_dtype``)."""
        self.lm_head: nn.Linear | None = None
        if not config.share_embeddings_and_output_weights:
            self.lm_head = _linear(config.hidden_size, config.padded_vocab_size, False, dtype=dtype)
        self.mtp: MultiTokenPrediction | None = None
        """The multi-token prediction depths (``config.mtp_num_layers``; built last, so the other weights draw the
        same random values as without them)."""
        if config.mtp_depths:
            last = config.num_layers - 1
            self.mtp = MultiTokenPrediction(config, lambda: LlamaDecoderLayer(config, last, dtype=dtype), dtype=dtype,
                                            linear=_linear)

        self.cp_layout: tuple[int, int] | None = None
        """``(context_parallel_size, cp_rank)`` when ``apply_context_parallel`` ran: inputs are this rank's zig-zag
        slice of each sequence, and forward calls without ``position_ids`` use its absolute positions."""

        offload = config.cpu_offloading and config.cpu_offloading_activations
        self.num_offloaded_layers = config.cpu_offloading_num_layers if offload else 0
        if config.cpu_offloading and self.num_offloaded_layers == 0:
            warn_once(
                logger,
                "cpu_offloading_noop",
                "model.cpu_offloading=True offloads nothing "
                "(cpu_offloading_activations=%s, cpu_offloading_num_layers=%d)",
                config.cpu_offloading_activations,
                config.cpu_offloading_num_layers,
            )

        if target.type != "meta":
            self.to_empty(device=target)
            self.init_weights()

    @property
    def has_output_layer(self) -> bool:
        """False for a pipeline stage that ends before the final norm (it returns hidden states)."""
        return self.norm is not None

    def decoder_layers(self) -> list[nn.Module]:
        """The decoder layers this module holds, in forward order."""
        return list(self.layers.values()) if isinstance(self.layers, nn.ModuleDict) else list(self.layers)

    @property
    def output_weight(self) -> torch.Tensor:
        """The ``[padded_vocab, hidden]`` matrix that produces the logits (the embedding when tied)."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def _default_position_ids(self, s: int, device: torch.device) -> torch.Tensor:
        if self.cp_layout is not None:
            return _zigzag_positions(s, self.cp_layout, device).unsqueeze(0)
        return torch.arange(s, device=device).unsqueeze(0)

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialize every parameter and buffer in place, in a fixed order (deterministic per torch seed).

        Weights of linear and embedding layers, MoE routers and routed experts: ``normal(0, init_method_std)``; the
        output projections (``o_proj``, ``down_proj``, the experts' ``down_proj``) use
        ``init_method_std / sqrt(2 * num_layers)`` as Megatron's
        ``output_layer_init_method``; biases zero; norm scales one; RoPE frequencies recomputed.
        Random values are drawn in float32 on the parameter's device and rounded to its dtype.
        """
        std = self.config.init_method_std
        out_std = std / math.sqrt(2.0 * self.config.num_layers)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                _normal_(module.weight, out_std if getattr(module, _OUTPUT_PROJECTION, False) else std)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.Embedding):
                _normal_(module.weight, std)
            elif isinstance(module, (RMSNorm, LayerNorm, RotaryEmbedding)):
                module.reset_parameters()
            elif isinstance(module, TopKRouter):
                module.reset_parameters(std)
            elif isinstance(module, GroupedExperts):
                module.reset_parameters(std, out_std)
            elif isinstance(module, LlamaAttention):
                module.reset_parameters()

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        loss_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the decoder.

        Args:
            input_ids: token ids ``[b, s]``; for a pipeline stage without the embedding, the previous stage's hidden
                states ``[b, s, hidden]``.
            position_ids: RoPE positions ``[b, s]`` (or ``[1, s]``); None means ``0..s-1`` (under context
                parallelism: the absolute positions of this rank's zig-zag slice).
            labels: target ids ``[b, s]``; positions with label ``-100`` get loss 0.
            loss_mask: ``[b, s]``, read only by multi-token prediction (``models/mtp.py``; None: every token), which
                in training mode with labels attaches its loss for backward without changing the returned values.

        Returns:
            Without labels, the logits ``[b, s, padded_vocab_size]`` in the model dtype. With labels, the per-token
            cross-entropy ``[b, s]`` in float32 (computed in float32 from the logits, no reduction), as Megatron's
            GPTModel. A pipeline stage without the output layer returns its hidden states ``[b, s, hidden]``.
        """
        embeds = self.embeds_input and self.embed_tokens is not None
        expected_dims = 2 if embeds else 3
        if input_ids.dim() != expected_dims:
            what = "input_ids must have shape [batch, seq]" if expected_dims == 2 else \
                "a pipeline stage's input must have shape [batch, seq, hidden]"
            raise MegatronBridgeError(f"{what}; got {tuple(input_ids.shape)}.")
        b, s = input_ids.shape[:2]
        if position_ids is None:
            position_ids = self._default_position_ids(s, input_ids.device)
        if labels is not None and labels.shape != input_ids.shape[:2]:
            raise MegatronBridgeError(
                f"labels shape {tuple(labels.shape)} must equal input_ids shape {tuple(input_ids.shape)}."
            )

        hidden_states = self._embed(input_ids) if embeds else input_ids
        rope = self.rotary_emb(position_ids)
        local_rope = self.rotary_emb(position_ids, local=True) if self.rotary_emb.has_local else rope
        for idx, layer in enumerate(self.decoder_layers()):
            offload = idx < self.num_offloaded_layers
            ctx = torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()) if offload else nullcontext()
            with ctx:
                hidden_states = layer(hidden_states, *(local_rope if layer.uses_local_rope else rope))
        if self.norm is None:
            dtype = self.stage_output_dtype
            return hidden_states if dtype is None or hidden_states.dtype == dtype else hidden_states.to(dtype)
        hidden_states = self.norm(hidden_states)
        if self.mtp is not None and labels is not None and self.training:
            hidden_states = self.mtp.attach_loss(hidden_states, input_ids, labels, loss_mask, (rope, local_rope),
                                                 self._embed, self._logits)
        logits = self._logits(hidden_states)
        if labels is None:
            return logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none")
        # A fresh tensor, not a view: FSDP2 registers its pre-backward hook on the output, and an in-place op on a
        # view would silently drop it (FSDP2 warns about views).
        return loss.view(b, s).clone()


    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The token embeddings ``[b, s, hidden]`` (times sqrt(hidden) with ``scale_embeddings_by_sqrt_hidden``)."""
        hidden_states = self.embed_tokens(input_ids)
        if self.config.scale_embeddings_by_sqrt_hidden:
            # The factor rounded to the embedding's dtype first, as Gemma (transformers' ScaledWordEmbedding) does.
            scale = torch.tensor(math.sqrt(self.config.hidden_size), dtype=torch.float32, device=hidden_states.device)
            hidden_states = hidden_states * scale.to(hidden_states.dtype)
        return hidden_states

    def _logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The output layer on final-normed hidden states (the logits ``[b, s, padded_vocab]``), soft-capped when
        ``final_logit_softcapping`` is set (Gemma 2)."""
        # Through the lm_head module (not F.linear on its weight) so tensor parallelism's module hooks apply.
        logits = F.linear(hidden_states, self.output_weight) if self.lm_head is None else self.lm_head(hidden_states)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else softcap(logits, cap)


def _zigzag_positions(seq_local: int, layout: tuple[int, int], device: torch.device) -> torch.Tensor:
    from megatron_bridge.data.zigzag import zigzag_positions

    cp, rank = layout
    return zigzag_positions(seq_local * cp, cp, rank, device=device)


def _normal_(tensor: torch.Tensor, std: float) -> None:
    """Fill ``tensor`` with ``normal(0, std)`` drawn in float32 (every params_dtype gets the same values, rounded)."""
    if tensor.dtype == torch.float32:
        tensor.normal_(0.0, std)
    else:
        tensor.copy_(torch.empty_like(tensor, dtype=torch.float32).normal_(0.0, std))
