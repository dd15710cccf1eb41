"""``cfg.model``: the GPT/Llama-family decoder to build, and how it is split over devices."""

from dataclasses import dataclass
from typing import Literal, get_args

from megatron_bridge.config.declared import DeclaredFields


DType = Literal["float32", "bfloat16", "float16"]
PipelineSchedule = Literal["1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"]

SCHEDULES: tuple[str, ...] = get_args(PipelineSchedule)
"""Values of ``model.pipeline_schedule`` (torch.distributed.pipelining class names without ``Schedule``)."""
SINGLE_STAGE_SCHEDULES = ("1F1B",)
"""Schedules with one stage per rank (no virtual stages)."""
V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")
"""Schedules with the V-shaped stage placement (exactly two stages per rank)."""
SPLIT_BACKWARD_SCHEDULES = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
"""Zero-bubble schedules: backward split into input and weight gradients (FSDP2 must keep parameters unsharded)."""


@dataclass(kw_only=True)
class ModelConfig(DeclaredFields):
    """Architecture, parallel layout and memory options of a Llama-family decoder-only model.

    The provider in :mod:`megatron_bridge.models.provider` turns this into model chunks.
    """

    family: str | None = None
    """Model family (a name registered in :mod:`megatron_bridge.config.families`: "llama", "qwen3", "qwen3_moe",
    ...): what the Bridge exports it as, which perf configs and recipes it has. Recipes set it. None, in a config
    written before this field existed, is resolved at ``finalize()`` from the shape (q/k norm with experts:
    "qwen3_moe", q/k norm: "qwen3", else "llama"), logged once (adjustment ``model_family``)."""
    num_layers: int = 2
    """Number of decoder blocks."""
    hidden_size: int = 64
    """Width of the residual stream."""
    ffn_hidden_size: int = 176
    """Inner width of the MLP (per gate for SwiGLU)."""
    num_attention_heads: int = 4
    """Number of query heads."""
    num_query_groups: int | None = None
    """Number of key/value heads for grouped-query attention; None means one per query head (plain MHA)."""
    kv_channels: int | None = None
    """Width of one attention head; None means hidden_size // num_attention_heads."""
    vocab_size: int = 256
    """Tokenizer vocabulary size (before padding)."""
    make_vocab_size_divisible_by: int = 128
    """The embedding table is padded to a multiple of this (times the TP size), as in Megatron."""
    seq_length: int = 128
    """Maximum sequence length the model is trained on; must equal dataset.seq_length."""
    rotary_base: float = 10000.0
    """RoPE base frequency (theta). Llama 3 uses 500000."""
    rope_scaling: bool = False
    """Apply Llama 3.1-style RoPE frequency scaling (long-context extension)."""
    rope_scaling_factor: float = 8.0
    """Llama 3.1 RoPE scaling factor; used only when rope_scaling is True."""
    rope_low_freq_factor: float = 1.0
    """Llama 3.1 RoPE low-frequency factor; used only when rope_scaling is True."""
    rope_high_freq_factor: float = 4.0
    """Llama 3.1 RoPE high-frequency factor; used only when rope_scaling is True."""
    rope_original_max_position_embeddings: int = 8192
    """Context length the RoPE scaling was derived for; used only when rope_scaling is True."""
    position_embedding_type: Literal["rope", "yarn"] = "rope"
    """Rotary position embedding (Megatron-Bridge's field): "rope" (plain RoPE, or Llama 3.1 scaling with
    rope_scaling) or "yarn" (YaRN frequency interpolation with the yarn_* fields below, as Hugging Face's
    ``rope_type: yarn``)."""
    yarn_rotary_scaling_factor: float = 1.0
    """YaRN: the context extension factor (Hugging Face's ``factor``)."""
    yarn_original_max_position_embeddings: int = 4096
    """YaRN: the context length the RoPE frequencies were trained for (``original_max_position_embeddings``)."""
    yarn_beta_fast: float = 32.0
    """YaRN: rotations above which dimensions keep their frequency (extrapolation; ``beta_fast``)."""
    yarn_beta_slow: float = 1.0
    """YaRN: rotations below which dimensions are interpolated by the factor (``beta_slow``)."""
    yarn_mscale: float = 1.0
    """YaRN: with yarn_mscale_all_dim > 0, the attention factor is mscale(factor, yarn_mscale) /
    mscale(factor, yarn_mscale_all_dim), where mscale(s, m) = 0.1 · m · ln(s) + 1 (1 for s <= 1); it multiplies the
    cos/sin tables (Hugging Face's ``mscale``)."""
    yarn_mscale_all_dim: float = 0.0
    """YaRN: see yarn_mscale; 0 gives the attention factor 0.1 · ln(factor) + 1 (Hugging Face without ``mscale``)."""
    yarn_correction_range_round_to_int: bool = True
    """YaRN: round the interpolation ramp's bounds to whole dimensions (Hugging Face's ``truncate``, default True;
    GPT-OSS sets False)."""
    rotary_base_local: float | None = None
    """RoPE base of the window (local) layers, those attention_window gives a window (Megatron-Bridge Gemma 3's
    ``rotary_base_local``; Hugging Face's ``rope_parameters["sliding_attention"]``, legacy ``rope_local_base_freq``):
    plain RoPE, without rope_scaling, YaRN or seq_len_interpolation_factor. None: rotary_base in every layer."""
    seq_len_interpolation_factor: float | None = None
    """Linear RoPE scaling (megatron-core's field; Hugging Face's ``rope_type: linear``, ``factor``): positions are
    divided by it, i.e. the inverse frequencies of the rotary_base RoPE. With rotary_base_local set it scales only the
    full-attention (global) layers, as Gemma 3 4B and up. None: no linear scaling."""
    max_position_embeddings: int | None = None
    """Longest sequence the positional encoding is meant for (Hugging Face's max_position_embeddings, e.g. 131072
    for Llama 3.1); None means seq_length. Only recorded and exported; training uses seq_length."""
    window_size: tuple[int, int] | None = None
    """Sliding-window attention as megatron-core writes it (Megatron-Bridge's field): ``(left, right)`` keys before
    and after each query; ``(W - 1, 0)`` is Hugging Face's ``sliding_window = W`` (W tokens including the current
    one). Only causal windows (right = 0) are built. None: full causal attention in every layer."""
    window_attn_skip_freq: int | list[int] | None = None
    """Which layers keep full attention when window_size is set (megatron-core's field and meaning, layers numbered
    from 1): an int N makes every N-th layer full (layer_number % N == 0) and the others windowed; a list of 0/1 of
    length num_layers marks each layer (1 = windowed). None: every layer windowed."""
    normalization: Literal["RMSNorm", "LayerNorm"] = "RMSNorm"
    """Normalization layer type."""
    layernorm_epsilon: float = 1e-5
    """Epsilon of the normalization layers."""
    layernorm_zero_centered_gamma: bool = False
    """Norm scales stored centred on zero: every norm (the per-head q/k norms too) computes ``norm(x) * (1 + w)``
    and initializes ``w`` to 0 (megatron-core's field; Gemma's RMSNorm)."""
    post_norms: bool = False
    """Four norms per layer (Gemma 2 and 3): besides the norms before the attention and the MLP, one on the
    attention's output and one on the MLP's output before each residual add (``decoder_names.POST_NORMS``)."""
    scale_embeddings_by_sqrt_hidden: bool = False
    """Multiply the input embeddings by sqrt(hidden_size), the factor rounded to the model dtype first (Gemma;
    Megatron-Bridge's Gemma3LanguageModelEmbedding)."""
    softmax_scale: float | None = None
    """Scale of the attention logits (megatron-core's field); None: 1 / sqrt(head width). Gemma 3 sets
    query_pre_attn_scalar ** -0.5. Applied to the queries after RoPE (so every attention path gets it)."""
    softmax_type: Literal["vanilla", "off-by-one", "learnable"] = "vanilla"
    """Attention softmax (megatron-core's field): "vanilla"; "off-by-one" joins a zero logit to every query's softmax
    (dropped after it); "learnable" joins one learned logit per head, the attention's ``sinks`` parameter (GPT-OSS's
    attention sinks, initialized to zero)."""
    attn_logit_softcapping: float | None = None
    """Soft-capping of the attention scores before the softmax, ``cap · tanh(scores / cap)`` (Gemma 2, 50.0;
    Megatron-Bridge's Gemma2 provider field). The native engine computes the scores explicitly then (SDPA takes no
    function of them). None: no capping."""
    final_logit_softcapping: float | None = None
    """Soft-capping of the output layer's logits, ``cap · tanh(logits / cap)`` (Gemma 2, 30.0; Megatron-Bridge's
    Gemma2 provider field). None: no capping."""
    activation: Literal["swiglu", "gelu", "geglu", "quick_geglu"] = "swiglu"
    """MLP activation: SwiGLU (gated SiLU, Llama), GELU (ungated, exact erf GELU, GPT-2), GeGLU (gated GELU with the
    tanh approximation, Gemma's ``gelu_pytorch_tanh``; megatron-core's ``fast_gelu``) or "quick_geglu", the gate
    through quick GELU ``g · σ(1.702 · g)`` (GPT-OSS; megatron-core's ``activation_func=quick_gelu`` with
    ``gated_linear_unit``)."""
    glu_linear_offset: float = 0.0
    """Offset added to the linear (up) half of a gated unit: ``act(gate) · (up + offset)`` (megatron-core's field;
    GPT-OSS 1.0). Applies to the routed experts (rule ``moe_clamped_glu``)."""
    activation_func_clamp_value: float | None = None
    """Clamp of the routed experts' gated unit before the activation (megatron-core's field; GPT-OSS 7.0): the gate
    to at most this value, the up half to ``±`` it. None: no clamp (rule ``moe_clamped_glu``)."""
    qk_layernorm: bool = False
    """Apply an RMSNorm to queries and keys per head before RoPE (Qwen3)."""
    add_bias_linear: bool = False
    """Add biases to the attention output and MLP linear layers; in MoE layers (as megatron-core) to the router's
    logits (``mlp.router.bias`` ``[E]``, GPT-OSS) and to the routed experts (``mlp.experts.{gate,up,down}_bias``,
    ``[E, F]``, ``[E, F]``, ``[E, hidden]``)."""
    attention_output_bias: bool | None = None
    """Bias on the attention output projection; None follows add_bias_linear. Hugging Face's attention_bias sets
    the query/key/value and output projections' biases together, independently of the MLP (mlp_bias)."""
    add_qkv_bias: bool = False
    """Add biases to the query/key/value projections (Qwen2)."""
    multi_latent_attention: bool = False
    """Multi-latent attention (DeepSeek-V2/V3, megatron-core's ``MLATransformerConfig`` field): queries through a
    low-rank ``q_lora_rank`` latent (or one projection when q_lora_rank is None), keys and values through one shared
    ``kv_lora_rank`` latent plus one RoPE key head shared by all heads (``models/mla.py``). The fields below set its
    widths; kv_channels and num_query_groups are not used by it."""
    q_lora_rank: int | None = 512
    """MLA: rank of the query latent (Hugging Face's ``q_lora_rank``); None projects queries directly (Moonlight,
    DeepSeek-V2-Lite). megatron-core's default."""
    kv_lora_rank: int = 512
    """MLA: rank of the shared key/value latent (``kv_lora_rank``)."""
    qk_head_dim: int = 128
    """MLA: width of the no-RoPE part of each query/key head (Hugging Face's ``qk_nope_head_dim``); a head is
    qk_head_dim + qk_pos_emb_head_dim wide (megatron-core's meaning)."""
    qk_pos_emb_head_dim: int = 64
    """MLA: width of the RoPE part of each query head and of the one shared RoPE key head (``qk_rope_head_dim``)."""
    v_head_dim: int = 128
    """MLA: width of each value head (``v_head_dim``); the output projection reads heads × v_head_dim."""
    share_embeddings_and_output_weights: bool = False
    """Tie the output layer to the input embedding."""
    init_method_std: float = 0.02
    """Standard deviation of the normal initialization of weights."""
    tensor_model_parallel_size: int = 1
    """Tensor-parallel size (TP)."""
    pipeline_model_parallel_size: int = 1
    """Pipeline-parallel size (PP)."""
    virtual_pipeline_model_parallel_size: int | None = None
    """Virtual pipeline stages (model chunks) per PP rank, for the multi-stage schedules; None: one stage per rank."""
    pipeline_schedule: PipelineSchedule | None = None
    """Pipeline schedule (torch.distributed.pipelining): None picks "1F1B" without virtual stages and
    "Interleaved1F1B" with them. "InterleavedZeroBubble" needs virtual stages; "ZBVZeroBubble" and "DualPipeV" need
    exactly 2 (V-shaped placement: rank r holds stages r and 2·PP−1−r); "DualPipeV" needs micro-batches >= PP×VP.
    Only with pipeline_model_parallel_size > 1."""
    num_layers_in_first_pipeline_stage: int | None = None
    """Decoder layers on the first pipeline rank (split evenly over its virtual stages); None: even split. The other
    layers are split evenly over the middle ranks. Not with account_for_*_in_pipeline_split."""
    num_layers_in_last_pipeline_stage: int | None = None
    """Decoder layers on the last pipeline rank (split evenly over its virtual stages); None: even split."""
    account_for_embedding_in_pipeline_split: bool = False
    """Count the embedding as one layer when splitting: (num_layers + 1 [+ 1]) is split evenly over PP×VP stages and
    the first stage holds one decoder layer fewer (Megatron-Bridge's 405B layout)."""
    account_for_loss_in_pipeline_split: bool = False
    """Count the output layer and loss as one layer when splitting: the last stage holds one decoder layer fewer."""
    pipeline_model_parallel_layout: str | list[list[str]] | None = None
    """What every pipeline stage holds, in pipeline order (megatron-core's and Megatron-Bridge's form): a string such
    as ``"Et|(tt|)*6,tL"`` (E embedding, t decoder layer, m MTP layer, L output layer + loss, ``|`` between stages,
    ``(..)*N`` and ``x*N`` repeat, commas are cosmetic) or a list of lists
    (``[["embedding"], ["decoder"] * 4, ["decoder", "loss"]]``). Stage ``s`` runs on pipeline rank ``s % PP``
    (the V schedules: their V placement); PP × (VP or 1) stages, the embedding first in stage 0, the loss last in the
    last stage, num_layers decoder layers; no MTP (mtp_num_layers is built without pipeline stages). None: the split
    of the fields above. Not with num_layers_in_first/last_pipeline_stage or account_for_*_in_pipeline_split
    (docs/training/pipeline-parallel.md)."""
    pipeline_dtype: DType | None = None
    """Dtype of the activations sent between pipeline stages: each stage but the last casts its output to it
    (e.g. "bfloat16" halves the traffic of fp32 residual streams). None sends them as computed. Ignored with PP=1."""
    overlap_p2p_comm: bool = False
    """megatron-core engine, interleaved schedule (virtual stages): overlap the pipeline sends/receives with compute
    (megatron-core's field). Not with batch_p2p_comm. The native engine's torch schedules ignore it."""
    batch_p2p_comm: bool = True
    """megatron-core engine: batch each step's pipeline sends/receives into one ``batch_isend_irecv`` (megatron-core's
    field and default). With virtual stages this path is silently wrong upstream (NVIDIA/Megatron-LM#750), so
    finalize() sets it False there, logged (adjustment ``megatron_core_vpp_p2p``). The native engine ignores it."""
    context_parallel_size: int = 1
    """Context-parallel size (CP): every sequence is cut into 2×CP chunks and CP rank r holds chunks r and 2·CP−1−r
    (zig-zag); gradients are reduced over data-parallel × CP ranks. See docs/training/context-parallel.md."""
    cp_comm_type: Literal["all_gather", "p2p"] = "all_gather"
    """Attention under CP: "all_gather" gathers the keys/values of the CP group (exact, every device); "p2p" is
    PyTorch's ring attention (torch.distributed.tensor.experimental.context_parallel, CUDA only, plain causal mask).
    Megatron's names; Megatron defaults to "p2p" (TE's ring), this library to the path that runs everywhere."""
    expert_model_parallel_size: int = 1
    """Expert-parallel size (EP) of mixture-of-experts models: the routed experts of each MoE layer are split over
    this many ranks of a pipeline stage, folded over its data-parallel × context-parallel × tensor-parallel ranks
    as megatron-core's MoE parallel folding does (TP ranks first); tokens travel to their experts with all-to-all.
    Must divide num_moe_experts, and EP × expert_tensor_parallel_size must divide DP × CP × TP. With TP > 1 each TP
    rank routes its own part of the tokens (megatron_bridge.distributed.expert_parallel)."""
    expert_tensor_parallel_size: int | None = None
    """Tensor-parallel size of the routed experts (ETP). None means Megatron's default, tensor_model_parallel_size.
    1: experts whole on every rank, EP folded over the TP ranks (each TP rank routes its own tokens); TP: each
    expert's F dimension split over the TP group (gate/up column-wise, down row-wise), tokens replicated over it, EP
    over the data-parallel × CP ranks. Other values are refused (rule expert_tensor_parallel)."""
    sequence_parallel: bool = False
    """Shard norms and dropout over the sequence dimension in the TP group; requires tensor_model_parallel_size > 1."""
    recompute_granularity: Literal["full", "selective"] | None = None
    """Activation recomputation: "full" recomputes whole blocks, "selective" only attention; None keeps activations."""
    recompute_method: Literal["uniform", "block"] | None = None
    """With full recompute: "uniform" recomputes every block, "block" only the first recompute_num_layers."""
    recompute_num_layers: int | None = None
    """With recompute_method="block": how many blocks (from the first) are recomputed."""
    cpu_offloading: bool = False
    """Offload activations (and optionally weights) of the first cpu_offloading_num_layers blocks to CPU memory."""
    cpu_offloading_num_layers: int = 0
    """How many blocks offload to CPU; must satisfy 0 <= n < num_layers."""
    cpu_offloading_activations: bool = True
    """With cpu_offloading: offload saved activations."""
    cpu_offloading_weights: bool = False
    """With cpu_offloading: offload weights too."""
    init_model_with_meta_device: bool = False
    """Build the model on the meta device and let the data-parallel wrapper materialize only its shards."""
    deterministic_mode: bool = False
    """Bit-reproducible runs (Megatron-Bridge's ``deterministic_mode``): training calls
    ``torch.use_deterministic_algorithms(True)`` and sets ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, ``NCCL_ALGO=Ring`` and
    ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` where the environment does not already set them (before the process
    groups start); the megatron-core engine also passes it to ``TransformerConfig``. Slower."""
    # -------------------------------------------------------------------------------- mixture of experts (MoE)
    num_moe_experts: int | None = None
    """Number of routed experts per MoE layer; None builds a dense model (every layer has the plain MLP)."""
    moe_ffn_hidden_size: int | None = None
    """Inner width of one routed expert (per gate, SwiGLU); None means ffn_hidden_size (Megatron's default)."""
    moe_router_topk: int = 2
    """Experts each token is routed to (k of top-k)."""
    moe_router_score_function: Literal["softmax", "sigmoid"] = "softmax"
    """Router scores: "softmax" over the experts (Mixtral, Qwen) or an independent "sigmoid" per expert
    (DeepSeek-V3). With sigmoid and k > 1 the k selected scores are divided by their sum."""
    moe_router_pre_softmax: bool = False
    """softmax only: True takes the top-k of the softmax over all experts (probabilities not renormalised); False
    (default) applies the softmax to the k selected logits, so the k probabilities sum to 1 (HF's norm_topk_prob)."""
    moe_router_topk_scaling_factor: float | None = None
    """Multiply the routing probabilities by this factor (DeepSeek's routed_scaling_factor); None leaves them."""
    moe_router_num_groups: int | None = None
    """Group-limited routing (DeepSeek-V3; megatron-core's field, Hugging Face's ``n_group``): the experts form this
    many equal groups of consecutive ids, and a token picks its top-k only inside the moe_router_group_topk groups
    with the highest group scores (a group's score: the sum of its two highest biased scores). None: no groups."""
    moe_router_group_topk: int | None = None
    """Group-limited routing: how many groups a token may use (megatron-core's field, Hugging Face's
    ``topk_group``); set together with moe_router_num_groups."""
    moe_router_load_balancing_type: Literal["aux_loss", "seq_aux_loss", "none"] = "aux_loss"
    """Load-balancing loss: "aux_loss" (Switch Transformer loss over the micro-batch's tokens), "seq_aux_loss"
    (the same loss per sequence, averaged over the sequences) or "none"."""
    moe_aux_loss_coeff: float = 0.0
    """Coefficient of the load-balancing loss (0 disables it). Its gradient is added to the training loss'; the loss
    itself is logged as "moe/load_balancing_loss", not added to the reported lm loss."""
    moe_z_loss_coeff: float | None = None
    """Coefficient of the router z-loss ``mean(logsumexp(logits)**2)`` (ST-MoE); None disables it."""
    moe_router_enable_expert_bias: bool = False
    """Auxiliary-loss-free load balancing (DeepSeek-V3): a per-expert bias added to the scores for the top-k choice
    only, updated after every step by ``moe_router_bias_update_rate * sign(mean load - load)`` from the step's global
    token counts. Stored in checkpoints as ``mlp.router.expert_bias``."""
    moe_router_bias_update_rate: float = 1e-3
    """Step size of the expert-bias update (moe_router_enable_expert_bias)."""
    moe_shared_expert_intermediate_size: int | None = None
    """Inner width of the shared expert(s) every token also goes through (all shared experts fused into one SwiGLU
    MLP of this width, as Megatron); None means no shared expert."""
    moe_layer_freq: int | list[int] = 1
    """Which layers are MoE: an int N makes every N-th layer MoE (layers 0, N, 2N, ...); a list of 0/1 of length
    num_layers marks each layer (1 = MoE). First-k-dense layouts (DeepSeek) are ``[0] * k + [1] * (L - k)``."""
    moe_grouped_gemm: bool = False
    """Compute the routed experts as grouped matmuls (``torch._grouped_mm``) where the device supports it; else, or
    when False, one matmul per expert. Both give the same numbers up to float rounding."""
    moe_token_dispatcher_type: Literal["alltoall", "allgather"] = "alltoall"
    """How tokens reach their experts across expert-parallel ranks. This version implements "alltoall"
    (all_to_all_single with uneven splits); "allgather" is accepted only with expert_model_parallel_size=1."""
    moe_expert_capacity_factor: float | None = None
    """Capacity factor of token dropping; None (the only supported value) means dropless routing."""
    moe_permute_fusion: bool = False
    """Megatron's fused permutation kernels (Transformer Engine). A GPU performance switch with no effect on the
    local engine (it always permutes with index ops); kept so Megatron-Bridge configs load."""
    mtp_num_layers: int | None = None
    """Multi-token prediction depths (megatron-core's field; Hugging Face DeepSeek-V3's
    ``num_nextn_predict_layers``): depth k embeds the tokens shifted by k, joins them with the previous depth's hidden
    states (``eh_proj`` of the normalized pair), runs one decoder layer built like the last one and predicts the
    token k + 1 ahead through the shared output layer (``models/mtp.py``). Its loss is added in training only; the
    main logits are unchanged. None or 0: off. Pipeline, context and tensor parallel sizes of 1 only (rule
    multi_token_prediction)."""
    mtp_loss_scaling_factor: float = 0.1
    """Weight of the multi-token-prediction loss: the mean over depths of each depth's masked cross-entropy, times
    this factor, is added to the training objective (megatron-core's field and default)."""

    engine: Literal["native", "megatron_core"] = "native"
    """Which implementation builds the model from these fields: "native" (this library's torch-native
    ``LlamaModel``: every feature, CPU and GPU) or "megatron_core" (megatron-core's ``GPTModel`` with the layer spec
    transformer_impl picks, wrapped by megatron-core's DistributedDataParallel and trained with its optimizer, as
    Megatron-Bridge trains it). Not a Megatron-Bridge field (it always builds megatron-core); what the
    megatron-core engine supports in this version is in docs/training/engines.md."""
    transformer_impl: Literal["local", "transformer_engine"] = "local"
    """Layer implementation: "local" (plain PyTorch layers, runs everywhere) or "transformer_engine" (fused
    transformer-engine layers; CUDA only, needs a transformer-engine that imports). With engine="megatron_core" it
    selects megatron-core's layer spec (local or transformer-engine), with Megatron-Bridge's meaning; the native
    engine builds only "local". Differs from Megatron-Bridge, whose recipes default to "transformer_engine"."""
    params_dtype: DType = "float32"
    """Storage dtype of the master weights. Mixed-precision presets keep float32 and compute in bf16/fp16."""

    @property
    def gated_linear_unit(self) -> bool:
        """Whether the MLP is gated (SwiGLU or GeGLU: gate, up and down projections; megatron-core's field)."""
        return self.activation in ("swiglu", "geglu", "quick_geglu")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.kv_channels if self.kv_channels is not None else self.hidden_size // self.num_attention_heads

    def attention_window(self, layer_idx: int) -> int | None:
        """The sliding window (in tokens, including the current one: ``window_size[0] + 1``) of decoder layer
        ``layer_idx`` (0-based), or None when it attends to the whole causal prefix (see window_attn_skip_freq)."""
        if self.window_size is None:
            return None
        freq = self.window_attn_skip_freq
        windowed = freq is None or (freq[layer_idx] == 1 if isinstance(freq, list) else (layer_idx + 1) % freq != 0)
        return self.window_size[0] + 1 if windowed else None

    @property
    def rope_head_dim(self) -> int:
        """Width RoPE rotates in each head: qk_pos_emb_head_dim with multi-latent attention, else head_dim."""
        return self.qk_pos_emb_head_dim if self.multi_latent_attention else self.head_dim

    @property
    def has_attention_output_bias(self) -> bool:
        """Whether the attention output projection has a bias (attention_output_bias, else add_bias_linear)."""
        return self.add_bias_linear if self.attention_output_bias is None else self.attention_output_bias

    @property
    def num_kv_heads(self) -> int:
        """Number of key/value heads."""
        return self.num_query_groups if self.num_query_groups is not None else self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        """True when the model has routed experts (num_moe_experts is set)."""
        return self.num_moe_experts is not None

    @property
    def expert_ffn_hidden_size(self) -> int:
        """Inner width of one routed expert (moe_ffn_hidden_size, else ffn_hidden_size)."""
        return self.moe_ffn_hidden_size if self.moe_ffn_hidden_size is not None else self.ffn_hidden_size

    @property
    def mtp_depths(self) -> int:
        """Multi-token prediction depths built: ``mtp_num_layers``, 0 when None."""
        return self.mtp_num_layers or 0

    def moe_layer_pattern(self) -> list[bool]:
        """Per layer, whether it is an MoE layer (all False for a dense model); see moe_layer_freq."""
        if self.num_moe_experts is None:
            return [False] * self.num_layers
        freq = self.moe_layer_freq
        if isinstance(freq, int):
            return [freq > 0 and i % freq == 0 for i in range(self.num_layers)]
        return [bool(x) for x in freq]

    @property
    def padded_vocab_size(self) -> int:
        """Vocabulary size padded to a multiple of make_vocab_size_divisible_by × TP (Megatron's rule)."""
        multiple = self.make_vocab_size_divisible_by * self.tensor_model_parallel_size
        return ((self.vocab_size + multiple - 1) // multiple) * multiple


def resolve_schedule(m: ModelConfig) -> str:
    """``model.pipeline_schedule``, or the default: Interleaved1F1B with virtual stages, else 1F1B."""
    if m.pipeline_schedule is not None:
        return m.pipeline_schedule
    return "Interleaved1F1B" if m.virtual_pipeline_model_parallel_size is not None else "1F1B"
