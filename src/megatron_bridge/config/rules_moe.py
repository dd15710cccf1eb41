"""Validation rules of mixture-of-experts models and expert parallelism (the ``model.moe_*`` fields)."""

from typing import TYPE_CHECKING

from megatron_bridge.config.rule_registry import fail, positive, rule
from megatron_bridge.config.rules import layout_sizes_ok


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

_MOE_ONLY_FIELDS = ("moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_z_loss_coeff")


@rule("moe_router", ("model.num_moe_experts", "model.moe_router_topk", "model.moe_router_pre_softmax",
                     "model.moe_router_score_function", "model.activation"),
      "num_moe_experts >= 2 (or None), 1 <= moe_router_topk <= num_moe_experts; pre-softmax needs softmax scoring; "
      "experts are SwiGLU, or quick GeGLU (GPT-OSS) without a shared expert.")
def _router(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if m.num_moe_experts is None:
        set_fields = [f for f in _MOE_ONLY_FIELDS if getattr(m, f) is not None]
        set_fields += ["expert_model_parallel_size"] if m.expert_model_parallel_size > 1 else []
        if set_fields:
            fail(f"model.{set_fields[0]} is set but model.num_moe_experts is None (a dense model): set "
                 "model.num_moe_experts or unset it", f"model.{set_fields[0]}", "model.num_moe_experts")
        return
    e, k = m.num_moe_experts, m.moe_router_topk
    if not isinstance(e, int) or isinstance(e, bool) or e < 2:
        fail(f"model.num_moe_experts={e!r} must be an int >= 2 (or None for a dense model)", "model.num_moe_experts")
        return
    if not 1 <= k <= e:
        fail(f"model.moe_router_topk={k} must be in 1..model.num_moe_experts={e}", "model.moe_router_topk")
    if m.activation not in ("swiglu", "quick_geglu") or (m.activation != "swiglu"
                                                          and m.moe_shared_expert_intermediate_size):
        fail(f"model.activation={m.activation!r}: the routed experts are SwiGLU or quick-GeGLU MLPs (GPT-OSS), the "
             "shared expert SwiGLU; set model.activation='swiglu' (or 'quick_geglu' without a shared expert) for "
             "an MoE model", "model.activation")
    if m.moe_router_pre_softmax and m.moe_router_score_function != "softmax":
        fail("model.moe_router_pre_softmax=True applies to softmax scoring only (model.moe_router_score_function="
             f"{m.moe_router_score_function!r}): set it to False", "model.moe_router_pre_softmax")


@rule("moe_sizes", ("model.moe_ffn_hidden_size", "model.moe_shared_expert_intermediate_size",
                    "model.moe_router_topk_scaling_factor"),
      "moe_ffn_hidden_size and moe_shared_expert_intermediate_size are > 0 when set; the top-k scaling factor is > 0.")
def _sizes(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    for path, value in (("model.moe_ffn_hidden_size", m.moe_ffn_hidden_size),
                        ("model.moe_shared_expert_intermediate_size", m.moe_shared_expert_intermediate_size)):
        if value is not None and value <= 0:
            fail(f"{path} must be > 0 or None (got {value})", path)
    if m.moe_router_topk_scaling_factor is not None and m.moe_router_topk_scaling_factor <= 0:
        fail(f"model.moe_router_topk_scaling_factor must be > 0 or None (got {m.moe_router_topk_scaling_factor})",
             "model.moe_router_topk_scaling_factor")


@rule("moe_router_groups", ("model.moe_router_num_groups", "model.moe_router_group_topk"),
      "Group-limited routing: moe_router_num_groups and moe_router_group_topk set together, the groups divide "
      "num_moe_experts, 1 <= group_topk <= num_groups, and the kept groups hold at least moe_router_topk experts.")
def _groups(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    groups, keep = m.moe_router_num_groups, m.moe_router_group_topk
    if groups is None and keep is None:
        return
    if groups is None or keep is None:
        fail(f"model.moe_router_num_groups={groups!r} and model.moe_router_group_topk={keep!r}: set both "
             "(group-limited routing) or neither", "model.moe_router_num_groups", "model.moe_router_group_topk")
    if m.num_moe_experts is None or not positive(groups) or m.num_moe_experts % groups:
        fail(f"model.moe_router_num_groups={groups!r} must be > 0 and divide model.num_moe_experts="
             f"{m.num_moe_experts!r}", "model.moe_router_num_groups")
    if not 1 <= keep <= groups or keep * (m.num_moe_experts // groups) < m.moe_router_topk:
        fail(f"model.moe_router_group_topk={keep!r} must be in 1..{groups} and its groups must hold at least "
             f"model.moe_router_topk={m.moe_router_topk} experts", "model.moe_router_group_topk")


@rule("moe_losses", ("model.moe_aux_loss_coeff", "model.moe_z_loss_coeff", "model.moe_router_bias_update_rate",
                     "model.moe_router_load_balancing_type"),
      "moe_aux_loss_coeff, moe_z_loss_coeff and moe_router_bias_update_rate are >= 0; an aux-loss coefficient > 0 "
      "needs a load-balancing type other than 'none'.")
def _losses(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    for path, value in (("model.moe_aux_loss_coeff", m.moe_aux_loss_coeff),
                        ("model.moe_z_loss_coeff", m.moe_z_loss_coeff),
                        ("model.moe_router_bias_update_rate", m.moe_router_bias_update_rate)):
        if value is not None and value < 0:
            fail(f"{path} must be >= 0 (got {value})", path)
    if m.moe_aux_loss_coeff > 0 and m.moe_router_load_balancing_type == "none":
        fail(f"model.moe_aux_loss_coeff={m.moe_aux_loss_coeff} has no effect with "
             "model.moe_router_load_balancing_type='none': set the type to 'aux_loss' or the coefficient to 0",
             "model.moe_aux_loss_coeff", "model.moe_router_load_balancing_type")


@rule("moe_layer_freq", ("model.moe_layer_freq", "model.num_layers"),
      "moe_layer_freq is an int >= 1 or a list of 0/1 with one entry per layer.")
def _layer_freq(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    freq = m.moe_layer_freq
    if isinstance(freq, int) and not isinstance(freq, bool):
        if freq < 1:
            fail(f"model.moe_layer_freq={freq} must be >= 1 (1: every layer is MoE)", "model.moe_layer_freq")
        return
    if not isinstance(freq, list) or len(freq) != m.num_layers or any(x not in (0, 1) for x in freq):
        fail(f"model.moe_layer_freq={freq!r} must be an int >= 1 or a list of {m.num_layers} entries "
             "(model.num_layers) each 0 (dense) or 1 (MoE)", "model.moe_layer_freq")


@rule("moe_dropless", ("model.moe_expert_capacity_factor",),
      "Routing is dropless: moe_expert_capacity_factor must be None.")
def _dropless(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.model.moe_expert_capacity_factor is not None:
        fail(f"model.moe_expert_capacity_factor={cfg.model.moe_expert_capacity_factor} (token dropping) is not "
             "supported: the local engine routes dropless; set it to None", "model.moe_expert_capacity_factor")


def expert_tensor_parallel_size(cfg: "ConfigContainer") -> int:
    """The routed experts' tensor-parallel size (ETP): ``model.expert_tensor_parallel_size``, None meaning TP."""
    m = cfg.model
    etp = m.expert_tensor_parallel_size
    return m.tensor_model_parallel_size if etp is None else etp


def splits_tokens_over_tp(cfg: "ConfigContainer") -> bool:
    """True when the MoE layers of a TP group route disjoint parts of its tokens (MoE parallel folding with ETP 1:
    EP > 1 and TP > 1); otherwise every TP rank routes the same tokens."""
    m = cfg.model
    return (m.num_moe_experts is not None and m.expert_model_parallel_size > 1 and m.tensor_model_parallel_size > 1
            and expert_tensor_parallel_size(cfg) == 1)


@rule("expert_parallel_layout", ("model.expert_model_parallel_size", "model.num_moe_experts",
                                 "model.tensor_model_parallel_size", "model.context_parallel_size",
                                 "model.seq_length"),
      "EP divides num_moe_experts, and EP × ETP divides data-parallel size × CP × TP (MoE parallel folding: the "
      "experts are split over the data-parallel × context-parallel × tensor-parallel ranks of a pipeline stage); "
      "with EP and TP > 1 (ETP 1) seq_length is divisible by CP × TP (each TP rank routes its part).")
def _ep_layout(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    ep = m.expert_model_parallel_size
    if not positive(ep) or ep == 1 or not positive(m.num_moe_experts) or not layout_sizes_ok(cfg, world_size):
        return  # positive_sizes, moe_router and world_size_divisible name bad sizes
    if m.num_moe_experts % ep:
        fail(f"model.num_moe_experts={m.num_moe_experts} is not divisible by model.expert_model_parallel_size={ep}: "
             "every expert-parallel rank holds the same number of experts", "model.num_moe_experts",
             "model.expert_model_parallel_size")
    etp = expert_tensor_parallel_size(cfg)
    if etp not in (1, m.tensor_model_parallel_size):
        return  # expert_tensor_parallel names it
    stage = cfg.data_parallel_size(world_size) * m.context_parallel_size * m.tensor_model_parallel_size
    if stage % (ep * etp):
        fail(f"model.expert_model_parallel_size={ep} × expert tensor-parallel size {etp} must divide data-parallel "
             f"size × CP × TP = {stage} at world size {world_size} (the experts are split over the data-parallel, "
             "context-parallel and tensor-parallel ranks of a pipeline stage): change the EP size or the number of "
             "processes", "model.expert_model_parallel_size", "model.context_parallel_size",
             "model.tensor_model_parallel_size")
    split = m.context_parallel_size * m.tensor_model_parallel_size
    if splits_tokens_over_tp(cfg) and m.seq_length % split:
        fail(f"model.seq_length={m.seq_length} must be divisible by CP × TP = {split}: with "
             f"model.expert_model_parallel_size={ep} and TP > 1 each TP rank routes its part of the sequence; change "
             "the sequence length", "model.seq_length", "model.tensor_model_parallel_size")


@rule("expert_tensor_parallel", ("model.expert_tensor_parallel_size", "model.tensor_model_parallel_size",
                                 "model.moe_ffn_hidden_size"),
      "expert_tensor_parallel_size (None = TP) is 1 (experts whole, EP folded over the TP ranks) or TP (each expert's "
      "F dimension split over the TP group, tokens replicated over it; F divisible by TP).")
def _etp(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if m.num_moe_experts is None:
        return
    etp, tp = expert_tensor_parallel_size(cfg), m.tensor_model_parallel_size
    if etp not in (1, tp):
        fail(f"model.expert_tensor_parallel_size={m.expert_tensor_parallel_size} must be 1 or "
             f"model.tensor_model_parallel_size={tp}: set it to 1 (experts whole, EP folded over the TP ranks) or to "
             "TP (experts split over the TP group)", "model.expert_tensor_parallel_size",
             "model.tensor_model_parallel_size")
        return
    ffn = m.expert_ffn_hidden_size
    if etp > 1 and positive(ffn) and ffn % etp:
        fail(f"the experts' hidden size {ffn} (model.moe_ffn_hidden_size, else ffn_hidden_size) is not divisible by "
             f"the expert tensor-parallel size {etp}: set model.expert_tensor_parallel_size=1 or change the size",
             "model.moe_ffn_hidden_size", "model.expert_tensor_parallel_size")


@rule("moe_dispatcher", ("model.moe_token_dispatcher_type", "model.expert_model_parallel_size"),
      "Expert parallelism (EP > 1) uses moe_token_dispatcher_type 'alltoall'.")
def _dispatcher(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if m.num_moe_experts is not None and m.expert_model_parallel_size > 1 and m.moe_token_dispatcher_type != "alltoall":
        fail(f"model.moe_token_dispatcher_type={m.moe_token_dispatcher_type!r} is not implemented for expert "
             "parallelism: set it to 'alltoall'", "model.moe_token_dispatcher_type")


@rule("moe_backend", ("model.num_moe_experts", "dist.use_megatron_fsdp", "model.engine"),
      "MoE models train with DDP, FSDP2 or, on the native engine, Megatron FSDP (experts sharded over the "
      "expert-data-parallel group); the megatron-core engine's MoE models do not run on Megatron FSDP.")
def _backend(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if m.num_moe_experts is None or not cfg.dist.use_megatron_fsdp or m.engine != "megatron_core":
        return
    fail("model.num_moe_experts is set, dist.use_megatron_fsdp=True and model.engine='megatron_core': the "
         "megatron-core engine's MoE models are not wired to Megatron FSDP in this version; use "
         "model.engine='native' (Megatron FSDP shards its experts) or megatron-core DDP "
         "(dist.use_megatron_fsdp=False)", "dist.use_megatron_fsdp", "model.engine")


@rule("moe_clamped_glu", ("model.glu_linear_offset", "model.activation_func_clamp_value"),
      "glu_linear_offset and activation_func_clamp_value act on the routed experts only: set them on an MoE model "
      "whose every layer is MoE, without a shared expert; the clamp value is > 0.")
def _clamped_glu(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    clamp, offset = m.activation_func_clamp_value, m.glu_linear_offset
    if clamp is None and not offset:
        return
    path = "model.activation_func_clamp_value" if clamp is not None else "model.glu_linear_offset"
    value = clamp if clamp is not None else offset
    if clamp is not None and not clamp > 0:
        fail(f"model.activation_func_clamp_value={clamp!r} must be > 0 (or None: no clamp)", path)
    if m.num_moe_experts is None or not all(m.moe_layer_pattern()) or m.moe_shared_expert_intermediate_size:
        fail(f"{path}={value!r} applies to the routed experts only, but the model has dense MLPs or a shared expert "
             f"(num_moe_experts={m.num_moe_experts}, moe_layer_freq={m.moe_layer_freq!r}, "
             f"moe_shared_expert_intermediate_size={m.moe_shared_expert_intermediate_size}): make every layer MoE "
             f"without a shared expert, or unset {path}", path, "model.moe_layer_freq")


@rule("moe_expert_bias", ("model.add_bias_linear", "model.expert_tensor_parallel_size"),
      "An MoE model with add_bias_linear (router and expert biases, GPT-OSS) keeps its experts whole on each rank "
      "(expert_tensor_parallel_size 1, or TP 1) and has no shared expert.")
def _expert_bias(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if not m.add_bias_linear or m.num_moe_experts is None:
        return
    if m.moe_shared_expert_intermediate_size:
        fail(f"model.add_bias_linear=True with model.moe_shared_expert_intermediate_size="
             f"{m.moe_shared_expert_intermediate_size}: the shared expert has no biases here; unset one of them",
             "model.add_bias_linear", "model.moe_shared_expert_intermediate_size")
    if expert_tensor_parallel_size(cfg) != 1:
        fail(f"model.add_bias_linear=True with expert tensor parallelism {expert_tensor_parallel_size(cfg)} "
             f"(model.expert_tensor_parallel_size={m.expert_tensor_parallel_size!r}, TP "
             f"{m.tensor_model_parallel_size}): the expert biases are not split over ETP ranks; set "
             "model.expert_tensor_parallel_size=1", "model.expert_tensor_parallel_size", "model.add_bias_linear")
