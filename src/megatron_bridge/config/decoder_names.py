"""The shared decoder's module tree, declared once: the names of the modules that ``models/llama.py``,
``models/attention.py``, ``models/layers.py`` and ``models/moe.py`` build, which of them are attention, MLP, norms and
experts, and the whole tree for a :class:`~megatron_bridge.config.model.ModelConfig`.

Torch-free and at the config floor, so that ``config/`` rules (``tp_plan_matches_model``) can list a model's modules
without building it; the floors above (tensor and context parallelism, the megatron-core weight table, the Hugging
Face mapping) ask this module for the names instead of writing them out.
``tests/unit_tests/models/test_native_module_names.py`` keeps :func:`native_module_names` equal to the built model's
``named_modules()``, and ``tests/unit_tests/architecture/test_decoder_names.py`` fails when one of these names is
written out anywhere else in the library but ``models/`` and ``families/``.
"""

from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from megatron_bridge.config.model import ModelConfig

# the model
EMBEDDING = "embed_tokens"
ROTARY = "rotary_emb"
LAYERS = "layers"
FINAL_NORM = "norm"
OUTPUT = "lm_head"
# one decoder layer
ATTENTION_NORM = "input_layernorm"
ATTENTION = "self_attn"
MLP_NORM = "post_attention_layernorm"
MLP = "mlp"
ATTENTION_OUTPUT_NORM = "post_self_attn_layernorm"
"""With ``model.post_norms``: the norm on the attention's output (Hugging Face Gemma's ``post_attention_layernorm``)."""
MLP_OUTPUT_NORM = "post_mlp_layernorm"
"""With ``model.post_norms``: the norm on the MLP's output (Hugging Face Gemma's ``post_feedforward_layernorm``)."""
POST_NORMS = (ATTENTION_OUTPUT_NORM, MLP_OUTPUT_NORM)
# inside the attention
Q_PROJ, K_PROJ, V_PROJ, O_PROJ = "q_proj", "k_proj", "v_proj", "o_proj"
QKV = (Q_PROJ, K_PROJ, V_PROJ)
"""The column-wise input projections, in the order megatron-core fuses them."""
PROJECTIONS = (*QKV, O_PROJ)
SINKS = "sinks"
"""The attention's per-head sink logits (a parameter of the attention, ``model.softmax_type="learnable"``)."""
HEAD_NORMS = ("q_norm", "k_norm")
"""Per-head norms (``model.qk_layernorm``) of the query and key heads."""
# inside a multi-latent attention (model.multi_latent_attention; Hugging Face's DeepseekV3Attention names)
MLA_Q_DOWN, MLA_Q_NORM, MLA_Q_UP = "q_a_proj", "q_a_layernorm", "q_b_proj"
MLA_KV_DOWN, MLA_KV_NORM, MLA_KV_UP = "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj"


def mla_modules(cfg: "ModelConfig") -> tuple[str, ...]:
    """The submodules of one multi-latent attention, in build order: the query path (``q_proj`` without a query
    latent, else ``q_a_proj``, ``q_a_layernorm``, ``q_b_proj``), the key/value path and the output projection."""
    q = (Q_PROJ,) if cfg.q_lora_rank is None else (MLA_Q_DOWN, MLA_Q_NORM, MLA_Q_UP)
    return (*q, MLA_KV_DOWN, MLA_KV_NORM, MLA_KV_UP, O_PROJ)


def mla_parameters(cfg: "ModelConfig") -> list[str]:
    """The parameter names inside one multi-latent attention (every submodule has one ``weight``, no biases)."""
    return [f"{name}.weight" for name in mla_modules(cfg)]
# inside a dense MLP and the shared expert
GATE, UP, DOWN = "gate_proj", "up_proj", "down_proj"
MLP_PROJECTIONS = (GATE, UP, DOWN)
# inside an MoE layer
ROUTER, EXPERTS, SHARED_EXPERTS = "router", "experts", "shared_experts"
EXPERT_WEIGHTS = MLP_PROJECTIONS
"""Parameter names of the routed experts (each ``[num_local_experts, ...]``)."""
EXPERT_BIASES = ("gate_bias", "up_bias", "down_bias")
"""Parameter names of the routed experts' biases (``model.add_bias_linear``; each ``[num_local_experts, ...]``)."""
# multi-token prediction (model.mtp_num_layers; megatron-core's MultiTokenPredictionLayer names)
MTP = "mtp"
MTP_ENORM, MTP_HNORM, MTP_EH_PROJ = "enorm", "hnorm", "eh_proj"
MTP_LAYER, MTP_NORM = "transformer_layer", "final_layernorm"
"""One depth's decoder layer and the norm before the shared output layer."""
VOCAB_PARAMETERS = (f"{EMBEDDING}.weight", f"{OUTPUT}.weight")
"""The parameters with a vocabulary dimension (0): the embedding and the untied output layer."""


def layer(i: int | str) -> str:
    """The name of decoder layer ``i`` (``"*"`` for a wildcard over the layers)."""
    return f"{LAYERS}.{i}"


def attention(i: int | str) -> str:
    """The name of decoder layer ``i``'s attention."""
    return f"{layer(i)}.{ATTENTION}"


def mlp(i: int | str) -> str:
    """The name of decoder layer ``i``'s MLP (dense or MoE)."""
    return f"{layer(i)}.{MLP}"


def _mlp_names(cfg: "ModelConfig", prefix: str, moe: bool) -> list[str]:
    if not moe:
        gate = [GATE] if cfg.gated_linear_unit else []
        return [prefix] + [f"{prefix}.{n}" for n in (*gate, UP, DOWN)]
    names = [prefix, f"{prefix}.{ROUTER}", f"{prefix}.{EXPERTS}"]
    if cfg.moe_shared_expert_intermediate_size:
        shared = f"{prefix}.{SHARED_EXPERTS}"
        names += [shared] + [f"{shared}.{n}" for n in MLP_PROJECTIONS]
    return names


def mtp_layer(i: int | str) -> str:
    """The name of the multi-token prediction depth whose layer index is ``i`` (``num_layers + depth - 1``, the index
    Hugging Face DeepSeek-V3 checkpoints give it)."""
    return f"{MTP}.{LAYERS}.{i}"


def mtp_layer_indices(cfg: "ModelConfig") -> list[int]:
    """The layer indices of the multi-token prediction depths: ``num_layers .. num_layers + mtp_depths - 1``."""
    return [cfg.num_layers + k for k in range(cfg.mtp_depths)]


def _layer_names(cfg: "ModelConfig", i: int, moe: bool, where: str | None = None) -> list[str]:
    at = layer(i) if where is None else where
    attn = f"{at}.{ATTENTION}"
    norms = [f"{attn}.{n}" for n in HEAD_NORMS] if cfg.qk_layernorm else []
    inner = mla_modules(cfg) if cfg.multi_latent_attention else PROJECTIONS
    post = [f"{at}.{n}" for n in POST_NORMS] if cfg.post_norms else []
    return [at, f"{at}.{ATTENTION_NORM}", attn, *(f"{attn}.{n}" for n in inner), *norms,
            *post[:1], f"{at}.{MLP_NORM}", *_mlp_names(cfg, f"{at}.{MLP}", moe), *post[1:]]


def _mtp_names(cfg: "ModelConfig") -> list[str]:
    """The multi-token prediction depths' modules: each has the two input norms, the projection, a decoder layer
    built like the last one, and the norm before the output layer."""
    if not cfg.mtp_depths:
        return []
    names = [MTP, f"{MTP}.{LAYERS}"]
    last_moe = bool(cfg.moe_layer_pattern()[-1])
    for i in mtp_layer_indices(cfg):
        at = mtp_layer(i)
        names += [at, *(f"{at}.{sub}" for sub in (MTP_ENORM, MTP_HNORM, MTP_EH_PROJ))]
        names += _layer_names(cfg, cfg.num_layers - 1, last_moe, f"{at}.{MTP_LAYER}")
        names.append(f"{at}.{MTP_NORM}")
    return names


def native_module_names(cfg: "ModelConfig") -> list[str]:
    """The fully qualified module names of the whole shared decoder built from ``cfg`` (``""`` is the model itself),
    in ``named_modules()`` order."""
    moe = cfg.moe_layer_pattern()
    names = ["", EMBEDDING, ROTARY, LAYERS]
    for i in range(cfg.num_layers):
        names += _layer_names(cfg, i, bool(moe[i]))
    names.append(FINAL_NORM)
    if not cfg.share_embeddings_and_output_weights:
        names.append(OUTPUT)
    return names + _mtp_names(cfg)


def dense_layer_parameters(cfg: "ModelConfig") -> list[str]:
    """The parameter names inside one dense decoder layer with RMSNorm and a gated MLP (the Llama-style layer that
    the shared Hugging Face mapping names alike): its two norms, the attention's projections with the biases ``cfg``
    asks for, the per-head norms, the MLP's projections."""
    out = [f"{ATTENTION_NORM}.weight", f"{MLP_NORM}.weight"]
    for proj in QKV:
        out.append(f"{ATTENTION}.{proj}.weight")
        if cfg.add_qkv_bias:
            out.append(f"{ATTENTION}.{proj}.bias")
    out.append(f"{ATTENTION}.{O_PROJ}.weight")
    if cfg.has_attention_output_bias:
        out.append(f"{ATTENTION}.{O_PROJ}.bias")
    if cfg.qk_layernorm:
        out += [f"{ATTENTION}.{n}.weight" for n in HEAD_NORMS]
    if cfg.softmax_type == "learnable":
        out.append(f"{ATTENTION}.{SINKS}")
    for proj in MLP_PROJECTIONS:
        out.append(f"{MLP}.{proj}.weight")
        if cfg.add_bias_linear:
            out.append(f"{MLP}.{proj}.bias")
    return out
