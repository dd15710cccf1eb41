"""Validation rules of the model engine (``model.engine``) and the layer implementation (``model.transformer_impl``).

``engine="native"`` builds this library's torch-native model (only ``transformer_impl="local"``);
``engine="megatron_core"`` builds megatron-core's ``GPTModel`` (:mod:`megatron_bridge.engines.megatron_core`) with the
local
or the transformer-engine layer spec. The megatron-core path supports a subset of the features in this version; rule
``megatron_core_features`` names every field that asks for more, so ``validate()`` refuses what the build cannot
do. Probes import lazily: configs with the native engine never import torch, megatron-core or transformer-engine here.

Pipeline parallelism on this engine runs megatron-core's own schedules; rule ``megatron_core_pipeline`` refuses what
they do not have (the zero-bubble and V schedules, P2P overlap without virtual stages, ...).
"""

from typing import TYPE_CHECKING

from megatron_bridge.config.rule_registry import fail, positive, rule
from megatron_bridge.config.rules import layout_sizes_ok
from megatron_bridge.errors import ConfigValidationError


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.config.model import ModelConfig

MEGATRON_CORE_INSTALL = ("megatron-core 0.19.2 is a core dependency on Python 3.12: rebuild the environment with "
                         "`make venv` (docs/installation.md)")
TE_INSTALL = "install transformer-engine[pytorch] on a CUDA machine (pip install 'megatron-bridge[te]')"


def require_native_engine(config: "ModelConfig", caller: str) -> None:
    """Raise ConfigValidationError unless ``config.engine`` is "native": ``caller`` builds the native engine's model
    (API misuse: the engine's ``build_model_chunks`` picks the builder from the config)."""
    if config.engine != "native":
        raise ConfigValidationError(
            f"{caller} builds the native engine, but model.engine={config.engine!r}: build megatron-core "
            "chunks with megatron_bridge.engines.megatron_core.provider.build_gpt_chunks(cfg, device) (pretrain() "
            "does), or set model.engine='native'", ("model.engine",))


def _problem(module: str) -> str | None:
    from megatron_bridge.utils.packages import import_problem

    return import_problem(module)


@rule("engine_available", ("model.engine",),
      "model.engine='megatron_core' needs megatron-core to import (a core dependency on Python 3.12).")
def _engine_available(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.model.engine != "megatron_core":
        return
    problem = _problem("megatron.core")
    if problem is not None:
        fail(f"model.engine='megatron_core' needs megatron-core, which does not import here ({problem}): "
             f"{MEGATRON_CORE_INSTALL}, or set model.engine='native'", "model.engine")


@rule("transformer_impl_available", ("model.transformer_impl", "model.engine"),
      "transformer_impl='transformer_engine' needs engine='megatron_core' and a transformer-engine that imports.")
def _transformer_impl(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if m.transformer_impl != "transformer_engine":
        return
    if m.engine != "megatron_core":
        fail(f"model.transformer_impl='transformer_engine' with model.engine={m.engine!r}: the native engine builds "
             "only plain PyTorch layers; set model.engine='megatron_core' (megatron-core's transformer-engine "
             "layer spec) or model.transformer_impl='local'", "model.transformer_impl", "model.engine")
    problem = _problem("transformer_engine")
    if problem is not None:
        fail(f"model.transformer_impl='transformer_engine' needs transformer-engine, which does not work here "
             f"({problem}): {TE_INSTALL}, or set model.transformer_impl='local'", "model.transformer_impl")


@rule("megatron_core_context_parallel", ("model.context_parallel_size", "model.transformer_impl"),
      "With engine='megatron_core', context parallelism needs transformer_impl='transformer_engine' (TE attention).")
def _mcore_cp(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if m.engine != "megatron_core" or m.context_parallel_size <= 1 or m.transformer_impl == "transformer_engine":
        return
    fail(f"model.context_parallel_size={m.context_parallel_size} with model.engine='megatron_core' and "
         "model.transformer_impl='local': megatron-core's context parallelism runs only in transformer-engine's "
         "attention (TEDotProductAttention); set model.transformer_impl='transformer_engine' on a CUDA machine with "
         "transformer-engine, model.context_parallel_size=1, or model.engine='native' (its all-gather context "
         "parallelism runs everywhere)", "model.context_parallel_size", "model.transformer_impl")


@rule("megatron_core_mla", ("model.multi_latent_attention", "model.transformer_impl"),
      "With engine='megatron_core', no multi-latent attention: megatron-core 0.19.2's local attention cannot build it "
      "and this version maps no MLA config to its transformer-engine spec.")
def _mcore_mla(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if m.engine != "megatron_core" or not m.multi_latent_attention:
        return
    fail("model.multi_latent_attention=True with model.engine='megatron_core': megatron-core 0.19.2's local "
         "(transformer-engine-free) DotProductAttention takes no k_channels/v_channels, so its MLASelfAttention cannot "
         "be built on the local spec (it needs TEDotProductAttention on a GPU), and this version maps neither "
         "MLATransformerConfig (model.q_lora_rank, model.kv_lora_rank, model.qk_head_dim, model.qk_pos_emb_head_dim, "
         "model.v_head_dim) nor the MLA weights; set model.engine='native'", "model.multi_latent_attention",
         "model.engine")


def _engine_ckpt_format(cfg: "ConfigContainer") -> str:
    """The checkpoint format of the megatron-core engine: ``fsdp_dtensor`` under Megatron FSDP (megatron-core's
    optimizer has no other sharding type there), else megatron-core's ``torch_dist``."""
    return "fsdp_dtensor" if cfg.dist.use_megatron_fsdp else "torch_dist"


def _fail_unsupported(bad: list[tuple[str, object, str]], where: str, alternatives: str, *paths: str) -> None:
    """Refuse every (field, value, fix) in ``bad`` in one message: what is set, ``where`` it is unsupported, the fixes
    and the ``alternatives``; names ``paths`` and every field of ``bad``."""
    what = ", ".join(f"{path}={value!r}" for path, value, _ in bad)
    fixes = ", ".join(f"{path}={fix}" for path, _, fix in bad)
    fail(f"{what}: not supported {where} in this version (docs/training/engines.md): set {fixes}, or {alternatives}",
         *paths, *(path for path, _, _ in bad))


def _unsupported(cfg: "ConfigContainer") -> list[tuple[str, object, str]]:
    """(field, value, fix) of every setting the megatron-core engine does not build in this version. megatron-core's
    Llama 3.1 RoPE scaling takes only the factor (low/high frequency factors 1 and 4, original context 8192 fixed);
    its add_bias_linear sets the attention output projection and MLP biases together. Gemma's pieces are refused by
    name: megatron-core's local layer spec has no post-norms, no scaled embedding and no per-layer RoPE, and its torch
    norms refuse zero-centred scales (Megatron-Bridge builds them with its own Gemma 3 spec on transformer-engine).
    Attention sinks (softmax_type) are refused: megatron-core 0.19.2's local attention allocates its softmax offset
    on the current CUDA device (Megatron-LM PR 6270 is open), and transformer-engine needs cuDNN >= 9.18 for them.
    Logit soft-capping (Gemma 2) is refused: megatron-core 0.19.2's TransformerConfig has no soft-capping field.
    GPT-OSS's experts are refused by name (quick GeGLU, glu_linear_offset, activation_func_clamp_value, and the router
    and expert biases of an MoE model with add_bias_linear): the provider and its weight layout do not map them yet.
    Multi-token prediction (mtp_num_layers) is refused: megatron-core 0.19.2's MTP loss logger allocates its tracker
    on the current CUDA device, so its GPTModel cannot train MTP on CPU, and no MTP weight layout is mapped."""
    m, c = cfg.model, cfg.checkpoint
    ckpt_io = bool(c.save or c.load or c.pretrained_checkpoint)
    checks: list[tuple[bool, str, object, str]] = [
        (m.has_attention_output_bias != m.add_bias_linear, "model.attention_output_bias", m.attention_output_bias,
         "None"),
        # megatron-core's MoELayer refuses TP > 1 without sequence parallelism (and its local spec needs Apex for SP:
        # rule megatron_core_sequence_parallel)
        (m.is_moe and m.tensor_model_parallel_size > 1 and not m.sequence_parallel, "model.sequence_parallel",
         m.sequence_parallel, "True"),
        # megatron-core scores a group by its top moe_router_topk // group_topk experts, this library by its top 2
        (m.moe_router_num_groups is not None, "model.moe_router_num_groups", m.moe_router_num_groups, "None"),
        (m.rope_scaling and m.rope_low_freq_factor != 1.0, "model.rope_low_freq_factor", m.rope_low_freq_factor,
         "1.0"),
        (m.rope_scaling and m.rope_high_freq_factor != 4.0, "model.rope_high_freq_factor", m.rope_high_freq_factor,
         "4.0"),
        (m.rope_scaling and m.rope_original_max_position_embeddings != 8192,
         "model.rope_original_max_position_embeddings", m.rope_original_max_position_embeddings, "8192"),
        (m.position_embedding_type != "rope", "model.position_embedding_type", m.position_embedding_type, "'rope'"),
        (m.rotary_base_local is not None, "model.rotary_base_local", m.rotary_base_local, "None"),
        (m.layernorm_zero_centered_gamma, "model.layernorm_zero_centered_gamma", True, "False"),
        (m.post_norms, "model.post_norms", True, "False"),
        (m.softmax_type != "vanilla", "model.softmax_type", m.softmax_type, "'vanilla'"),
        (m.attn_logit_softcapping is not None, "model.attn_logit_softcapping", m.attn_logit_softcapping, "None"),
        (m.final_logit_softcapping is not None, "model.final_logit_softcapping", m.final_logit_softcapping, "None"),
        # GPT-OSS's experts: the provider maps neither quick GeGLU nor the clamp/offset, the weight layout no biases
        (m.activation == "quick_geglu", "model.activation", m.activation, "'swiglu'"),
        (m.glu_linear_offset != 0.0, "model.glu_linear_offset", m.glu_linear_offset, "0.0"),
        (m.activation_func_clamp_value is not None, "model.activation_func_clamp_value",
         m.activation_func_clamp_value, "None"),
        (m.add_bias_linear and m.num_moe_experts is not None, "model.add_bias_linear", True, "False"),
        (m.scale_embeddings_by_sqrt_hidden, "model.scale_embeddings_by_sqrt_hidden", True, "False"),
        # megatron-core 0.19.2's MTP loss logger allocates on the current CUDA device (MTPLossLoggingHelper)
        (bool(m.mtp_depths), "model.mtp_num_layers", m.mtp_num_layers, "None"),
        (m.recompute_granularity is not None, "model.recompute_granularity", m.recompute_granularity, "None"),
        (m.cpu_offloading, "model.cpu_offloading", m.cpu_offloading, "False"),
        (m.init_model_with_meta_device, "model.init_model_with_meta_device", m.init_model_with_meta_device, "False"),
        (cfg.quantization.quant_cfg is not None, "quantization.quant_cfg", cfg.quantization.quant_cfg, "None"),
        (cfg.distillation.enabled, "distillation.teacher_checkpoint", cfg.distillation.teacher_checkpoint, "None"),
        (c.ckpt_format != _engine_ckpt_format(cfg) and ckpt_io, "checkpoint.ckpt_format", c.ckpt_format,
         repr(_engine_ckpt_format(cfg))),
    ]
    return [(path, value, fix) for bad, path, value, fix in checks if bad]


MEGATRON_CORE_WEIGHT_FIELDS = ("model.attention_output_bias", "model.post_norms", "model.softmax_type",
                               "model.add_bias_linear", "model.mtp_num_layers",
                               "model.layernorm_zero_centered_gamma", "model.scale_embeddings_by_sqrt_hidden")
"""The fields of rule ``megatron_core_features`` that change the model's weights: a megatron-core checkpoint of a
model that sets them cannot be written (the others only refuse training on that engine)."""


def megatron_core_weight_problems(cfg: "ConfigContainer") -> list[tuple[str, object, str]]:
    """(field, value, fix) of the settings of rule ``megatron_core_features`` in :data:`MEGATRON_CORE_WEIGHT_FIELDS`
    that ``cfg`` sets: what stops a conversion into a megatron-core checkpoint."""
    problems = [problem for problem in _unsupported(cfg) if problem[0] in MEGATRON_CORE_WEIGHT_FIELDS]
    if cfg.model.multi_latent_attention:  # rule megatron_core_mla: no MLA weight layout on that engine here
        problems.append(("model.multi_latent_attention", True, "False"))
    return problems


@rule("megatron_core_features", ("model.engine",),
      "With engine='megatron_core', only the features its provider builds in this version: TP and PP with megatron-core"
      " DDP (TP with Megatron FSDP or FSDP2) and its optimizer, torch_dist checkpoints (DDP and FSDP2: sync or "
      "async_save; fsdp_dtensor with Megatron FSDP); "
      "MoE with megatron-core's MoELayer (EP, ETP as its parallel state folds them); no recompute, offloading, "
      "quantization or distillation.")
def _mcore_features(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.model.engine != "megatron_core":
        return
    bad = _unsupported(cfg)
    if bad:
        _fail_unsupported(bad, "by model.engine='megatron_core'", "use model.engine='native'", "model.engine")


@rule("megatron_core_sequence_parallel", ("model.sequence_parallel", "model.transformer_impl"),
      "With engine='megatron_core' and the local layer spec, sequence parallelism needs Apex (megatron-core's torch "
      "norms refuse it).")
def _mcore_sequence_parallel(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if m.engine != "megatron_core" or not m.sequence_parallel or m.transformer_impl != "local":
        return
    problem = _problem("apex")
    if problem is not None:
        fail(f"model.sequence_parallel=True with model.engine='megatron_core' and model.transformer_impl='local': "
             f"without Apex ({problem}) megatron-core's local layer spec builds its norms with torch "
             "(WrappedTorchNorm), which refuses sequence parallelism; set model.sequence_parallel=False, "
             "model.transformer_impl='transformer_engine' on a CUDA machine with transformer-engine, or install Apex",
             "model.sequence_parallel", "model.transformer_impl")


MEGATRON_CORE_SCHEDULES = ("1F1B", "Interleaved1F1B")
"""The values of ``model.pipeline_schedule`` megatron-core runs: ``forward_backward_pipelining_without_interleaving``
and, with virtual stages, ``forward_backward_pipelining_with_interleaving``."""


@rule("megatron_core_pipeline", ("model.pipeline_schedule", "model.overlap_p2p_comm", "model.pipeline_dtype",
                                 "model.num_layers_in_first_pipeline_stage", "train.global_batch_size"),
      "With engine='megatron_core' and PP > 1: megatron-core's schedules (1F1B, Interleaved1F1B), overlap_p2p_comm "
      "only with virtual stages, pipeline_dtype = params_dtype, not both first/last stage sizes at PP=2 with virtual "
      "stages, interleaved micro-batches a multiple of PP.")
def _mcore_pipeline(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    pp, vp = m.pipeline_model_parallel_size, m.virtual_pipeline_model_parallel_size
    if m.engine != "megatron_core" or pp <= 1:
        return
    if m.pipeline_schedule is not None and m.pipeline_schedule not in MEGATRON_CORE_SCHEDULES:
        fail(f"model.pipeline_schedule={m.pipeline_schedule!r} with model.engine='megatron_core': megatron-core has "
             f"only {list(MEGATRON_CORE_SCHEDULES)} (None picks the one for model.virtual_pipeline_model_parallel_size)"
             "; set model.pipeline_schedule=None, or use model.engine='native' (torch.distributed.pipelining runs "
             "every schedule)", "model.pipeline_schedule", "model.engine")
    if m.overlap_p2p_comm and vp is None:
        fail("model.overlap_p2p_comm=True without virtual stages: megatron-core's 1F1B schedule does not overlap its "
             "P2P communication; set model.overlap_p2p_comm=False or model.virtual_pipeline_model_parallel_size",
             "model.overlap_p2p_comm", "model.virtual_pipeline_model_parallel_size")
    if m.overlap_p2p_comm and m.batch_p2p_comm:
        fail("model.overlap_p2p_comm=True and model.batch_p2p_comm=True: megatron-core uses one or the other; set "
             "model.batch_p2p_comm=False", "model.overlap_p2p_comm", "model.batch_p2p_comm")
    if m.pipeline_dtype is not None and m.pipeline_dtype != m.params_dtype:
        fail(f"model.pipeline_dtype={m.pipeline_dtype!r} with model.params_dtype={m.params_dtype!r} and "
             "model.engine='megatron_core': megatron-core sends the activations in the dtype they are computed in and "
             "sizes its receive buffers with pipeline_dtype; set model.pipeline_dtype=None", "model.pipeline_dtype")
    first, last = m.num_layers_in_first_pipeline_stage, m.num_layers_in_last_pipeline_stage
    if vp is not None and pp == 2 and first is not None and last is not None:
        fail(f"model.num_layers_in_first_pipeline_stage={first} and model.num_layers_in_last_pipeline_stage={last} "
             "with PP=2 and virtual stages: megatron-core (0.19) places the layers of this split by dividing by the "
             "number of middle pipeline ranks, which is 0 (ZeroDivisionError); set only one of the two (the other "
             "rank holds the rest), e.g. model.num_layers_in_last_pipeline_stage=None",
             "model.num_layers_in_first_pipeline_stage", "model.num_layers_in_last_pipeline_stage")
    if vp is None or not (layout_sizes_ok(cfg, world_size) and positive(cfg.train.micro_batch_size,
                                                                        cfg.train.global_batch_size)):
        return  # positive_sizes and world_size_divisible name a bad layout
    n_micro = cfg.num_microbatches(world_size)
    if n_micro < pp or n_micro % pp:
        per_micro = cfg.train.global_batch_size // max(1, n_micro)  # micro_batch_size × data-parallel size
        fix = per_micro * pp * max(1, -(-n_micro // pp))
        fail(f"train.global_batch_size={cfg.train.global_batch_size} gives {n_micro} micro-batch(es) per step "
             f"(global batch / (micro-batch size × data-parallel size)) with model.pipeline_model_parallel_size={pp} "
             "and virtual stages: megatron-core's interleaved schedule runs the micro-batches in groups of PP, so "
             f"their number must be a multiple of {pp}; set e.g. train.global_batch_size={fix}",
             "train.global_batch_size", "model.pipeline_model_parallel_size")


_FSDP2_NO_PP = ("Megatron-LM refuses --use-torch-fsdp2 with pipeline parallelism (megatron/training/arguments.py): "
                "no upstream path runs megatron-core's pipeline schedules over its FSDP2 wrapper")
"""Why FSDP2 on the megatron-core engine runs without pipeline stages."""


_MFSDP_NO_PP = ("megatron-core 0.19's Megatron FSDP adapter lays the whole world out as DP x EP x TP "
                "(mcore_fsdp_adapter._get_dp_tp_mesh), so with pipeline stages its device mesh fails to build "
                "(measured: einops 'Shape mismatch'); use megatron-core DDP for PP")
"""Why Megatron FSDP on the megatron-core engine runs without pipeline stages in this version."""


def _fsdp_unsupported(cfg: "ConfigContainer") -> list[tuple[str, object, str]]:
    """(field, value, fix) of what megatron-core's FSDP wrappers
    (:mod:`megatron_bridge.engines.megatron_core.megatron_fsdp`,
    :mod:`megatron_bridge.engines.megatron_core.fsdp2`) cannot do in this version."""
    m, d, f, o = cfg.model, cfg.ddp, cfg.fsdp2, cfg.optimizer
    mp = cfg.mixed_precision_config
    checks: list[tuple[bool, str, object, str]] = []
    if cfg.dist.use_megatron_fsdp:
        checks += [
            (m.pipeline_model_parallel_size > 1, "model.pipeline_model_parallel_size", m.pipeline_model_parallel_size,
             f"1 ({_MFSDP_NO_PP})"),
            (m.virtual_pipeline_model_parallel_size is not None, "model.virtual_pipeline_model_parallel_size",
             m.virtual_pipeline_model_parallel_size, f"None ({_MFSDP_NO_PP})"),
            (d.report_nan_in_param_grad, "ddp.report_nan_in_param_grad", d.report_nan_in_param_grad,
             "False (megatron-core's adapter checks with ddp.check_for_nan_in_grad=True)"),
            (d.calculate_per_token_loss, "ddp.calculate_per_token_loss", d.calculate_per_token_loss, "False"),
            (d.megatron_fsdp_mlp_activation_checkpointing, "ddp.megatron_fsdp_mlp_activation_checkpointing",
             d.megatron_fsdp_mlp_activation_checkpointing, "False"),
            (mp is not None and mp.fp16, "mixed_precision", cfg.mixed_precision,
             "'bf16_mixed' or 'fp32' (fp16 and its loss scaler are not tested with Megatron FSDP in this version)"),
        ]
    if cfg.dist.use_torch_fsdp2:
        checks += [
            (m.pipeline_model_parallel_size > 1, "model.pipeline_model_parallel_size", m.pipeline_model_parallel_size,
             f"1 ({_FSDP2_NO_PP})"),
            (m.virtual_pipeline_model_parallel_size is not None, "model.virtual_pipeline_model_parallel_size",
             m.virtual_pipeline_model_parallel_size, f"None ({_FSDP2_NO_PP})"),
            (mp is not None and mp.fp16, "mixed_precision", cfg.mixed_precision,
             "'bf16_mixed' or 'fp32' (Megatron-LM refuses --use-torch-fsdp2 with fp16: megatron-core's FSDP2 "
             "wrapper has no loss-scaled gradient path)"),
            (o.use_distributed_optimizer or d.use_distributed_optimizer, "optimizer.use_distributed_optimizer",
             o.use_distributed_optimizer or d.use_distributed_optimizer,
             "False (FSDP2 shards the optimizer state itself; Megatron-LM refuses it too)"),
            (m.share_embeddings_and_output_weights, "model.share_embeddings_and_output_weights",
             m.share_embeddings_and_output_weights,
             "False (FSDP2 shards the embedding and the output layer apart; Megatron-LM requires untied ones)"),
            (f.mp_policy is not None, "fsdp2.mp_policy", f.mp_policy, "None"),
            (f.offload_policy is not None, "fsdp2.offload_policy", f.offload_policy, "None"),
            (f.autocast_dtype is not None, "fsdp2.autocast_dtype", f.autocast_dtype, "None"),
            (f.activation_checkpointing not in (False, None), "fsdp2.activation_checkpointing",
             f.activation_checkpointing, "False"),
            (f.mlp_activation_checkpointing, "fsdp2.mlp_activation_checkpointing", f.mlp_activation_checkpointing,
             "False"),
            (f.enable_compile, "fsdp2.enable_compile", f.enable_compile, "False"),
            (f.enable_async_tensor_parallel, "fsdp2.enable_async_tensor_parallel", f.enable_async_tensor_parallel,
             "False"),
            (f.tp_plan is not None, "fsdp2.tp_plan", f.tp_plan,
             "None (megatron-core's own tensor parallelism applies)"),
        ]
    return [(path, value, fix) for bad, path, value, fix in checks if bad]


@rule("megatron_core_fsdp", ("model.engine", "dist.use_megatron_fsdp", "dist.use_torch_fsdp2"),
      "With engine='megatron_core', Megatron FSDP (megatron-core's adapter) runs without pipeline parallelism, in "
      "fp32 or bf16_mixed, with fsdp_dtensor checkpoints (every sharding strategy, pretrained_checkpoint); FSDP2 "
      "(megatron-core's TorchFullyShardedDataParallel) with torch_dist checkpoints (sync or async, "
      "pretrained_checkpoint) and bf16, without pipeline parallelism, fp16, the distributed optimizer, tied "
      "embeddings or the native engine's FSDP2-only options.")
def _mcore_fsdp(cfg: "ConfigContainer", world_size: int) -> None:
    d = cfg.dist
    if cfg.model.engine != "megatron_core" or not (d.use_megatron_fsdp or d.use_torch_fsdp2):
        return
    bad = _fsdp_unsupported(cfg)
    if not bad:
        return
    wrapper = "dist.use_megatron_fsdp" if d.use_megatron_fsdp else "dist.use_torch_fsdp2"
    _fail_unsupported(bad, f"with {wrapper}=True on model.engine='megatron_core'",
                      "use megatron-core DDP (dist.use_megatron_fsdp=False, dist.use_torch_fsdp2=False) or "
                      "model.engine='native'", wrapper)


_TORCH_DDP_ONLY: tuple[tuple[str, object, str], ...] = (
    ("bucket_cap_mb", None, "ddp.bucket_size (megatron-core's DistributedDataParallelConfig.bucket_size, counted in "
     "parameters, not MiB)"),
    ("broadcast_buffers", False, "none: megatron-core broadcasts the parameters once when it wraps the chunks"),
    ("find_unused_parameters", False, "none: megatron-core's gradient buffers cover every parameter"),
    ("gradient_as_bucket_view", False, "none needed: megatron-core's gradients (main_grad) are always views of its "
     "contiguous buffers"),
    ("static_graph", False, "none: megatron-core DDP has no reducer to tell"),
    ("activation_checkpointing", False, "model.recompute_granularity (megatron-core's recompute; not built on this "
     "engine in this version)"),
    ("autocast_dtype", None, "a mixed_precision preset such as 'bf16_mixed' (bf16 weights in megatron-core's "
     "Float16Module)"),
)
"""The ``ddp`` options only torch's DistributedDataParallel reads: (field, default, megatron-core's equivalent)."""


@rule("megatron_core_ddp_options", tuple(f"ddp.{name}" for name, _, _ in _TORCH_DDP_ONLY),
      "With engine='megatron_core', torch DDP's own options (ddp.bucket_cap_mb, broadcast_buffers, "
      "find_unused_parameters, gradient_as_bucket_view, static_graph, activation_checkpointing, autocast_dtype) "
      "keep their defaults: megatron-core's wrappers do not read them (each error names the equivalent).")
def _mcore_ddp_options(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.model.engine != "megatron_core":
        return
    for name, default, equivalent in _TORCH_DDP_ONLY:
        value = getattr(cfg.ddp, name)
        if value != default:
            fail(f"ddp.{name}={value!r} is an option of torch's DistributedDataParallel, which "
                 f"model.engine='megatron_core' does not use: set ddp.{name}={default!r}; megatron-core's "
                 f"equivalent: {equivalent}", f"ddp.{name}")
