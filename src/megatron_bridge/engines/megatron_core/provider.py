"""``GPTModel`` chunks of megatron-core from this library's :class:`~megatron_bridge.config.model.ModelConfig`.

Field mapping (Megatron-Bridge's ``GPTModelProvider`` has the same fields, so the names carry over one to one):

=========================================  ==================================================================
this library (``cfg.model``)                megatron-core
=========================================  ==================================================================
num_layers, hidden_size, ffn_hidden_size,   ``TransformerConfig`` fields of the same names
num_attention_heads, num_query_groups,
kv_channels, layernorm_epsilon,
normalization, qk_layernorm,
add_bias_linear, add_qkv_bias,
init_method_std, sequence_parallel,
tensor/pipeline/context parallel sizes,
virtual_pipeline_model_parallel_size,
num_layers_in_first/last_pipeline_stage,
account_for_embedding/loss_in_pipeline_split,
pipeline_model_parallel_layout,
overlap_p2p_comm, batch_p2p_comm,
cp_comm_type (TE attention under CP),
window_size, window_attn_skip_freq,
deterministic_mode
activation="swiglu" / "geglu" / "gelu"     ``gated_linear_unit=True, activation_func=F.silu`` / ``True, fast_gelu``
                                            (tanh GELU) / ``False, F.gelu``
softmax_scale                               ``TransformerConfig(softmax_scale=...)``
params_dtype, pipeline_dtype (None:         ``TransformerConfig`` bf16/fp16, dtypes, FP8/FP4 fields
params_dtype), mixed precision              (:mod:`.precision`); bf16/fp16 chunks in ``Float16Module``
padded_vocab_size, seq_length               ``GPTModel(vocab_size=..., max_sequence_length=...)``
rotary_base, rope_scaling(_factor),         ``GPTModel(position_embedding_type="rope", rotary_base=...,
seq_len_interpolation_factor                rope_scaling=..., rope_scaling_factor=...,
                                            seq_len_interpolation_factor=...)``
share_embeddings_and_output_weights         ``GPTModel(share_embeddings_and_output_weights=...)``
transformer_impl                            layer spec: ``get_gpt_layer_local_spec`` ("local") or
                                            ``get_gpt_layer_with_transformer_engine_spec``
=========================================  ==================================================================

Under pipeline parallelism every rank builds one ``GPTModel`` per virtual stage (``vp_stage``), with
``pre_process`` (embedding) on the first stage and ``post_process`` (final norm, output layer, loss) on the last;
megatron-core places the layers from the split fields above, exactly as
:func:`megatron_bridge.config.pipeline_layout.build_stage_specs` does for the native engine (stage ``s`` on pipeline
rank ``s % PP``; tests/unit_tests/models/test_megatron_core_pipeline_split.py compares the two). The schedule is
megatron-core's (:mod:`.pipeline`).

The native model has no dropout, so both dropouts are 0; no fused kernels are requested (they need CUDA extensions
this library does not require), nor CUDA graphs (``cuda_graph_modules=[]``: megatron-core's default ``"full"`` means
the same and warns that it is deprecated). Weights are initialised on the CPU when the model is built on the CPU
(``use_cpu_initialization``), else on the current CUDA device.
"""

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from megatron_bridge.engines.megatron_core.forward_step import accept_native_call
from megatron_bridge.engines.megatron_core.precision import DTYPES
from megatron_bridge.utils.logging import get_logger, log_rank_0


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.config.model import ModelConfig

logger = get_logger(__name__)



def transformer_config(model: "ModelConfig", device: torch.device, precision: dict[str, Any] | None = None) -> Any:
    """megatron-core's ``TransformerConfig`` for ``model`` (see the module docstring for the mapping); ``precision``
    (:func:`megatron_bridge.engines.megatron_core.precision.transformer_precision`) replaces the dtype fields and adds
    the
    bf16/fp16 and FP8/FP4 ones."""
    from megatron.core.activations import fast_gelu
    from megatron.core.transformer.transformer_config import TransformerConfig

    activation_func = {"swiglu": F.silu, "geglu": fast_gelu}.get(model.activation, F.gelu)
    kwargs: dict[str, Any] = dict(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        ffn_hidden_size=model.ffn_hidden_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_kv_heads,
        kv_channels=model.head_dim,
        normalization=model.normalization,
        layernorm_epsilon=model.layernorm_epsilon,
        qk_layernorm=model.qk_layernorm,
        gated_linear_unit=model.gated_linear_unit,
        activation_func=activation_func,
        softmax_scale=model.softmax_scale,
        add_bias_linear=model.add_bias_linear,
        add_qkv_bias=model.add_qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=model.init_method_std,
        tensor_model_parallel_size=model.tensor_model_parallel_size,
        pipeline_model_parallel_size=model.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=model.virtual_pipeline_model_parallel_size,
        num_layers_in_first_pipeline_stage=model.num_layers_in_first_pipeline_stage,
        num_layers_in_last_pipeline_stage=model.num_layers_in_last_pipeline_stage,
        account_for_embedding_in_pipeline_split=model.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=model.account_for_loss_in_pipeline_split,
        pipeline_model_parallel_layout=_layout(model),
        overlap_p2p_comm=model.overlap_p2p_comm,
        batch_p2p_comm=model.batch_p2p_comm,
        context_parallel_size=model.context_parallel_size,
        cp_comm_type=model.cp_comm_type,
        window_size=tuple(model.window_size) if model.window_size is not None else None,
        window_attn_skip_freq=model.window_attn_skip_freq,
        sequence_parallel=model.sequence_parallel,
        params_dtype=DTYPES[model.params_dtype],
        pipeline_dtype=DTYPES[model.pipeline_dtype or model.params_dtype],
        use_cpu_initialization=device.type == "cpu",
        attention_softmax_in_fp32=True,
        deterministic_mode=model.deterministic_mode,
        cuda_graph_modules=[],  # no CUDA graphs; 0.19.2's default "full" warns on every build that it is deprecated
    )
    kwargs.update(moe_fields(model))
    kwargs.update(precision or {})
    return TransformerConfig(**kwargs)


_MOE_FIELDS = ("num_moe_experts", "moe_router_topk", "moe_router_score_function",
               "moe_router_pre_softmax", "moe_router_topk_scaling_factor", "moe_router_load_balancing_type",
               "moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_router_enable_expert_bias",
               "moe_router_bias_update_rate", "moe_shared_expert_intermediate_size", "moe_layer_freq",
               "moe_token_dispatcher_type", "moe_expert_capacity_factor", "expert_model_parallel_size")
"""``ModelConfig`` fields passed to ``TransformerConfig`` under the same name (MoE models only)."""


def moe_fields(model: "ModelConfig") -> dict[str, Any]:
    """The ``TransformerConfig`` fields of an MoE model (none for a dense one): :data:`_MOE_FIELDS` as they are,
    ``moe_ffn_hidden_size`` (None: ffn_hidden_size, as both engines read it), ``expert_tensor_parallel_size`` (None: TP,
    megatron-core's default), router logits in float32 as the native
    router computes them (``moe_router_dtype="fp32"``). With the local spec the experts are megatron-core's
    ``SequentialMLP`` (one matmul per expert: its grouped ``GroupedMLP`` needs the ``grouped_gemm`` package) and the
    permutation unfused (``moe_permute_fusion`` needs transformer-engine): ``moe_grouped_gemm`` and
    ``moe_permute_fusion`` are kept only with the transformer-engine spec (they change speed, not numbers)."""
    if not model.is_moe:
        return {}
    fields = {name: getattr(model, name) for name in _MOE_FIELDS}
    te = model.transformer_impl == "transformer_engine"
    fields.update(
        moe_ffn_hidden_size=model.expert_ffn_hidden_size,
        expert_tensor_parallel_size=model.expert_tensor_parallel_size,
        moe_router_dtype="fp32",
        moe_grouped_gemm=model.moe_grouped_gemm and te,
        moe_permute_fusion=model.moe_permute_fusion and te,
    )
    if isinstance(fields["moe_layer_freq"], list):
        fields["moe_layer_freq"] = list(fields["moe_layer_freq"])
    return fields


def layer_spec(model: "ModelConfig", config: Any = None, vp_stage: int | None = None,
               pp_rank: int | None = None) -> Any:
    """The transformer layer spec ``model.transformer_impl`` selects (megatron-core's local or TE spec); for an MoE
    model the decoder block spec of pipeline rank ``pp_rank``'s stage ``vp_stage`` (dense and MoE layers as
    ``moe_layer_freq`` places them; needs the ``TransformerConfig`` ``config``)."""
    from megatron.core.models.gpt import gpt_layer_specs

    if model.is_moe:
        return gpt_layer_specs.get_gpt_decoder_block_spec(
            config, use_transformer_engine=model.transformer_impl == "transformer_engine",
            normalization=model.normalization, vp_stage=vp_stage, pp_rank=pp_rank)
    if model.transformer_impl == "transformer_engine":
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=model.qk_layernorm)
    return gpt_layer_specs.get_gpt_layer_local_spec(qk_layernorm=model.qk_layernorm,
                                                    normalization=model.normalization)


def _layout(model: "ModelConfig") -> str | list[list[str]] | None:
    """``model.pipeline_model_parallel_layout`` as ``TransformerConfig`` takes it (its list form needs lists)."""
    layout = model.pipeline_model_parallel_layout
    return layout if layout is None or isinstance(layout, str) else [list(stage) for stage in layout]


def build_gpt_chunks(cfg: "ConfigContainer", device: torch.device) -> list[torch.nn.Module]:
    """Initialise megatron-core's parallel state from ``cfg`` (:func:`.parallel_state.initialize`) and build this
    rank's ``GPTModel`` chunk(s) on ``device``: one per virtual pipeline stage (one without virtual stages).

    Raises:
        ConfigValidationError: a model rule of ``validate()`` fails (e.g. a feature rule ``megatron_core_features``).
        MegatronCoreNeedsCudaError: ``device`` is not a CUDA device.
    """
    from megatron_bridge.config.rule_set import enforce
    from megatron_bridge.engines.megatron_core import parallel_state
    from megatron_bridge.engines.megatron_core.precision import transformer_precision, wrap_float16

    enforce(cfg, "engine_available", "transformer_impl_available", "megatron_core_context_parallel",
            "megatron_core_features", "megatron_core_pipeline", "megatron_core_sequence_parallel", "pipeline_layers",
            "pipeline_layout",
            "megatron_core_precision", "fp8_requirements")
    parallel_state.initialize(cfg, device, cfg.rng.seed)
    model = cfg.model
    config = transformer_config(model, device, transformer_precision(cfg))
    vp = model.virtual_pipeline_model_parallel_size
    chunks = [wrap_float16(_build_chunk(model, config, device, vp_stage), config)
              for vp_stage in (range(vp) if vp else [None])]
    log_rank_0(logger, "Built megatron-core GPTModel (%s spec): %d layers, hidden %d, %d chunk(s), %s parameters on "
               "this rank", model.transformer_impl, model.num_layers, model.hidden_size, len(chunks),
               f"{sum(p.numel() for chunk in chunks for p in chunk.parameters()):,}")
    return chunks


def _build_chunk(model: "ModelConfig", config: Any, device: torch.device, vp_stage: int | None) -> torch.nn.Module:
    """The ``GPTModel`` of virtual stage ``vp_stage`` (None: no virtual stages) of this pipeline rank."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    gpt = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(model, config, vp_stage, ps.get_pipeline_model_parallel_rank()),
        vocab_size=model.padded_vocab_size,
        max_sequence_length=model.seq_length,
        pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
        post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
        share_embeddings_and_output_weights=model.share_embeddings_and_output_weights,
        position_embedding_type="rope",
        rotary_base=model.rotary_base,
        rope_scaling=model.rope_scaling,
        rope_scaling_factor=model.rope_scaling_factor,
        seq_len_interpolation_factor=model.seq_len_interpolation_factor,
        vp_stage=vp_stage,
    )
    gpt.register_forward_pre_hook(accept_native_call, with_kwargs=True)  # custom steps of the native model's form
    if device.type == "cuda":
        gpt.cuda(device)
    return gpt
