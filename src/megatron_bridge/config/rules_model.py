"""Validation rules of the model build: architecture the local engine can form, engines and parallel layouts it can
build. ``build_model_chunks`` enforces the same rules
(:func:`megatron_bridge.models.validation.check_model_buildable`), so ``validate()`` and
``--dry-run`` refuse exactly what the build would refuse.

The layout rule states what the engine builds today; context and expert parallelism relax it as they land
(pipeline parallelism has: the pipeline split is rule ``pipeline_layers`` of :mod:`.rules_pipeline`).
"""

import importlib.util
from typing import TYPE_CHECKING

from megatron_bridge.config.rule_registry import fail, positive, rule


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

ARCHITECTURE_RULES = ("field_types", "positive_sizes", "model_head_dim", "tensor_parallel_heads", "rope_scaling",
                      "multi_latent_attention",
                      "cpu_offloading_weights", "cpu_offloading_num_layers", "transformer_impl_available")
"""The rules a model config must pass to be built at all (``LlamaModel`` enforces them); transformer_impl_available
lives in :mod:`.rules_engine`."""
LAYOUT_RULES = ("engine_parallel_layout", "pipeline_layers")
"""The rules of the parallel layout the engine builds (``build_model_chunks`` enforces them too)."""


def is_importable(module_name: str) -> bool:
    """Whether ``module_name`` can be found, without importing it.

    Only the parent packages of a dotted name are imported. Errors while looking it up (a missing parent, or a
    package such as transformer-engine that raises ``RuntimeError`` on a machine without CUDA) count as "no".
    """
    try:
        return importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError, RuntimeError, OSError):
        return False


@rule("model_family", ("model.family",),
      "model.family names a registered model family (config/families.py).")
def _family(cfg: "ConfigContainer", world_size: int) -> None:
    from megatron_bridge.config.families import family_names

    family = cfg.model.family
    if family is not None and family not in family_names():
        fail(f"model.family={family!r} is not a registered model family: set one of {family_names()}",
             "model.family")


@rule("attention_window", ("model.window_size", "model.window_attn_skip_freq", "model.cp_comm_type"),
      "model.window_size is (left >= 0, 0) (causal windows only); window_attn_skip_freq is an int >= 1 or a 0/1 list "
      "of num_layers entries; native context parallelism with a window uses cp_comm_type='all_gather'.")
def _window(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if m.window_size is not None:
        left, right = m.window_size
        if left < 0 or right != 0:
            fail(f"model.window_size={tuple(m.window_size)!r}: only causal sliding windows (left >= 0, 0) are built; "
                 "Hugging Face's sliding_window=W is (W - 1, 0)", "model.window_size")
        if m.engine == "native" and m.context_parallel_size > 1 and m.cp_comm_type != "all_gather":
            fail(f"model.window_size={tuple(m.window_size)!r} with model.cp_comm_type={m.cp_comm_type!r}: ring "
                 "attention has only the plain causal mask; set model.cp_comm_type='all_gather'", "model.cp_comm_type")
    freq = m.window_attn_skip_freq
    if isinstance(freq, int) and freq < 1:
        fail(f"model.window_attn_skip_freq={freq}: every N-th layer is full attention, N >= 1",
             "model.window_attn_skip_freq")
    if isinstance(freq, list) and (len(freq) != m.num_layers or any(x not in (0, 1) for x in freq)):
        fail(f"model.window_attn_skip_freq={freq}: a list marks each of the {m.num_layers} layers with 1 (window) or 0 "
             "(full attention)", "model.window_attn_skip_freq")


@rule("yarn_rope", ("model.position_embedding_type", "model.rope_scaling", "model.yarn_rotary_scaling_factor",
                    "model.yarn_original_max_position_embeddings", "model.yarn_beta_fast", "model.yarn_beta_slow"),
      "With model.position_embedding_type='yarn': no Llama 3.1 rope_scaling, yarn_rotary_scaling_factor > 0, "
      "yarn_original_max_position_embeddings > 0 and yarn_beta_fast, yarn_beta_slow > 0.")
def _yarn(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if m.position_embedding_type != "yarn":
        return
    if m.rope_scaling:
        fail("model.position_embedding_type='yarn' with model.rope_scaling=True: the two RoPE scalings exclude each "
             "other; set model.rope_scaling=False (YaRN's factor is model.yarn_rotary_scaling_factor)",
             "model.rope_scaling")
    for name in ("yarn_rotary_scaling_factor", "yarn_original_max_position_embeddings", "yarn_beta_fast",
                 "yarn_beta_slow"):
        if not getattr(m, name) > 0:
            fail(f"model.{name}={getattr(m, name)!r} must be > 0 with model.position_embedding_type='yarn'",
                 f"model.{name}")


_MLA_SIZES = ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
_MLA_NOT_WITH = (("window_size", "None"), ("qk_layernorm", "False"), ("add_qkv_bias", "False"),
                 ("attention_output_bias", "False"), ("softmax_type", "'vanilla'"))


@rule("multi_latent_attention", ("model.multi_latent_attention", "model.q_lora_rank", "model.kv_lora_rank",
                                 "model.qk_head_dim", "model.qk_pos_emb_head_dim", "model.v_head_dim",
                                 "model.cp_comm_type"),
      "With model.multi_latent_attention: q_lora_rank > 0 or None, kv_lora_rank, qk_head_dim, v_head_dim > 0, "
      "qk_pos_emb_head_dim even and > 0; no sliding window, q/k norm, attention biases or sinks; native context "
      "parallelism "
      "with cp_comm_type='all_gather' only.")
def _mla(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if not m.multi_latent_attention:
        return
    if m.q_lora_rank is not None and not positive(m.q_lora_rank):
        fail(f"model.q_lora_rank={m.q_lora_rank!r} must be > 0, or None to project queries directly",
             "model.q_lora_rank")
    for name in _MLA_SIZES:
        if not positive(getattr(m, name)):
            fail(f"model.{name}={getattr(m, name)!r} must be > 0 with model.multi_latent_attention", f"model.{name}")
    if m.qk_pos_emb_head_dim % 2:
        fail(f"model.qk_pos_emb_head_dim={m.qk_pos_emb_head_dim} must be even (RoPE rotates pairs)",
             "model.qk_pos_emb_head_dim")
    for name, fix in _MLA_NOT_WITH:
        value = m.has_attention_output_bias if name == "attention_output_bias" else getattr(m, name)
        if value and value != "vanilla":
            fail(f"model.{name}={value!r} is not built with model.multi_latent_attention (DeepSeek's attention has "
                 f"none): set model.{name}={fix}", f"model.{name}")
    if m.engine == "native" and m.context_parallel_size > 1 and m.cp_comm_type != "all_gather":
        fail(f"model.cp_comm_type={m.cp_comm_type!r} with model.multi_latent_attention and context parallelism: ring "
             "attention is not built for MLA's softmax scale and value width; set model.cp_comm_type='all_gather'",
             "model.cp_comm_type")


@rule("per_layer_rope", ("model.rotary_base_local", "model.seq_len_interpolation_factor", "model.window_size"),
      "model.rotary_base_local > 0 and only with model.window_size (it is the window layers' RoPE); "
      "model.seq_len_interpolation_factor > 0, not with rope_scaling or YaRN.")
def _per_layer_rope(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if m.rotary_base_local is not None:
        if not m.rotary_base_local > 0:
            fail(f"model.rotary_base_local={m.rotary_base_local!r} must be > 0 (the window layers' RoPE base, e.g. "
                 "10000.0), or None", "model.rotary_base_local")
        if m.window_size is None:
            fail(f"model.rotary_base_local={m.rotary_base_local!r} without model.window_size: no layer has a window, "
                 "so no layer would use it; set model.window_size (and window_attn_skip_freq) or "
                 "model.rotary_base_local=None", "model.rotary_base_local", "model.window_size")
    factor = m.seq_len_interpolation_factor
    if factor is not None:
        if not factor > 0:
            fail(f"model.seq_len_interpolation_factor={factor!r} must be > 0 (linear RoPE scaling), or None",
                 "model.seq_len_interpolation_factor")
        if m.rope_scaling or m.position_embedding_type == "yarn":
            fail(f"model.seq_len_interpolation_factor={factor!r} with model.rope_scaling={m.rope_scaling} and "
                 f"model.position_embedding_type={m.position_embedding_type!r}: one RoPE scaling at a time; set "
                 "model.seq_len_interpolation_factor=None, or model.rope_scaling=False and "
                 "position_embedding_type='rope'", "model.seq_len_interpolation_factor")


@rule("attention_sinks", ("model.softmax_type", "model.cp_comm_type"),
      "Attention sinks (model.softmax_type 'off-by-one' or 'learnable') on the native engine: context parallelism "
      "with cp_comm_type='all_gather' only (ring attention has no sink column).")
def _attention_sinks(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if m.softmax_type == "vanilla" or m.engine != "native":
        return  # the megatron-core engine refuses sinks itself (rule megatron_core_features)
    if m.context_parallel_size > 1 and m.cp_comm_type != "all_gather":
        fail(f"model.softmax_type={m.softmax_type!r} with model.cp_comm_type={m.cp_comm_type!r}: ring attention "
             "(torch's context_parallel) has no sink column; set model.cp_comm_type='all_gather' (its attention over "
             "the gathered sequence joins the sinks)", "model.cp_comm_type", "model.softmax_type")


@rule("logit_softcapping", ("model.attn_logit_softcapping", "model.final_logit_softcapping", "model.cp_comm_type",
                            "model.multi_latent_attention"),
      "model.attn_logit_softcapping and model.final_logit_softcapping are None or > 0; soft-capped attention on the "
      "native engine: context parallelism with cp_comm_type='all_gather' only, not with multi-latent attention.")
def _logit_softcapping(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        cap = getattr(m, name)
        if isinstance(cap, (int, float)) and not isinstance(cap, bool) and not cap > 0:  # types: rule field_types
            fail(f"model.{name}={cap!r}: the cap must be a number > 0 (Gemma 2: attention 50.0, final 30.0), or None "
                 "for no soft-capping", f"model.{name}")
    if m.attn_logit_softcapping is None or m.engine != "native":
        return  # the megatron-core engine refuses soft-capping itself (rule megatron_core_features)
    if m.multi_latent_attention:
        fail(f"model.attn_logit_softcapping={m.attn_logit_softcapping} with model.multi_latent_attention=True: the "
             "multi-latent attention has no soft-capped path; set model.attn_logit_softcapping=None",
             "model.attn_logit_softcapping", "model.multi_latent_attention")
    if m.context_parallel_size > 1 and m.cp_comm_type != "all_gather":
        fail(f"model.attn_logit_softcapping={m.attn_logit_softcapping} with model.cp_comm_type={m.cp_comm_type!r}: "
             "ring attention (torch's context_parallel) runs SDPA, which cannot cap the scores; set "
             "model.cp_comm_type='all_gather' (its attention over the gathered sequence caps them)",
             "model.cp_comm_type", "model.attn_logit_softcapping")


@rule("model_head_dim", ("model.hidden_size", "model.num_attention_heads", "model.kv_channels"),
      "Without model.kv_channels, hidden_size is divisible by num_attention_heads; the head width is even (RoPE).")
def _head_dim(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if not positive(m.hidden_size, m.num_attention_heads) or (m.kv_channels is not None and not positive(
            m.kv_channels)):
        return  # positive_sizes names them
    if m.kv_channels is None and m.hidden_size % m.num_attention_heads:
        fail(f"model.hidden_size={m.hidden_size} is not divisible by model.num_attention_heads="
             f"{m.num_attention_heads}: change one of them, or set model.kv_channels", "model.num_attention_heads",
             "model.hidden_size")
    elif m.head_dim < 2 or m.head_dim % 2:
        fail(f"head width {m.head_dim} (model.kv_channels, or hidden_size // num_attention_heads) must be even and "
             ">= 2 for rotary embeddings: set model.kv_channels to an even number", "model.kv_channels")


@rule("rope_scaling", ("model.rope_scaling_factor", "model.rope_low_freq_factor", "model.rope_high_freq_factor"),
      "With model.rope_scaling, rope_scaling_factor > 0 and rope_high_freq_factor > rope_low_freq_factor > 0.")
def _rope(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if not m.rope_scaling:
        return
    if m.rope_scaling_factor <= 0:
        fail(f"model.rope_scaling_factor={m.rope_scaling_factor!r} must be > 0 (Llama 3.1 uses 8.0)",
             "model.rope_scaling_factor")
    if not m.rope_high_freq_factor > m.rope_low_freq_factor > 0:
        fail(f"model.rope_high_freq_factor={m.rope_high_freq_factor!r} must be greater than "
             f"model.rope_low_freq_factor={m.rope_low_freq_factor!r} > 0 (Llama 3.1 uses 4.0 and 1.0)",
             "model.rope_high_freq_factor", "model.rope_low_freq_factor")


@rule("cpu_offloading_weights", ("model.cpu_offloading_weights",),
      "model.cpu_offloading_weights=True is not supported by the local engine (activations only).")
def _offload_weights(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.model.cpu_offloading and cfg.model.cpu_offloading_weights:
        fail("model.cpu_offloading_weights=True is not supported by the local engine (only activations are "
             "offloaded): set model.cpu_offloading_weights=False", "model.cpu_offloading_weights")


@rule("engine_parallel_layout", ("model.expert_model_parallel_size",),
      "The layout is one the engine builds today: EP only with MoE layers.")
def _engine_layout(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    unsupported = [
        ("model.expert_model_parallel_size", m.expert_model_parallel_size,
         m.expert_model_parallel_size > 1 and not m.is_moe, 1),
    ]
    bad = [(path, value, fix) for path, value, is_bad, fix in unsupported if is_bad]
    if bad:
        what = ", ".join(f"{path}={value!r}" for path, value, _ in bad)
        fixes = ", ".join(f"{path}={fix!r}" for path, _, fix in bad)
        fail(f"{what}: not supported by the local engine in this version (use data, tensor, pipeline or context "
             f"parallelism or FSDP): set {fixes}", *(path for path, _, _ in bad))


@rule("multi_token_prediction", ("model.mtp_num_layers", "model.mtp_loss_scaling_factor",
                                 "model.pipeline_model_parallel_size", "model.context_parallel_size",
                                 "model.tensor_model_parallel_size"),
      "model.mtp_num_layers is None or >= 0 and mtp_loss_scaling_factor >= 0; multi-token prediction is built with "
      "pipeline, context and tensor parallel sizes of 1 only.")
def _mtp(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if m.mtp_num_layers is not None and m.mtp_num_layers < 0:
        fail(f"model.mtp_num_layers={m.mtp_num_layers!r} must be >= 1 (prediction depths), or None/0 for none",
             "model.mtp_num_layers")
    if not m.mtp_loss_scaling_factor >= 0:
        fail(f"model.mtp_loss_scaling_factor={m.mtp_loss_scaling_factor!r} must be >= 0 (megatron-core's default "
             "0.1)", "model.mtp_loss_scaling_factor")
    if not m.mtp_depths:
        return
    for path, size in (("model.pipeline_model_parallel_size", m.pipeline_model_parallel_size),
                       ("model.context_parallel_size", m.context_parallel_size),
                       ("model.tensor_model_parallel_size", m.tensor_model_parallel_size)):
        if size > 1:
            fail(f"model.mtp_num_layers={m.mtp_num_layers} with {path}={size}: multi-token prediction is built "
                 "without pipeline stages (it needs the embedding and the output layer of the last stage), without "
                 "context parallelism (its shifted tokens cross the CP slices) and without tensor parallelism in "
                 f"this version; set {path}=1 (data parallelism, FSDP and expert parallelism work) or "
                 "model.mtp_num_layers=None", path, "model.mtp_num_layers")
