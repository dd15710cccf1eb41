"""Every validation rule: one config that violates it (the error names the rule and the config path) and one that
passes. A test also checks that every registered rule has a case here."""

import re
from collections.abc import Callable

import pytest

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.distributed import FSDP2OffloadPolicy
from megatron_bridge.config.mixed_precision import (
    MixedPrecisionConfig,
    bf16_with_fp8_current_scaling_mixed,
    bf16_with_mxfp8_mixed,
)
from megatron_bridge.config.rule_set import RULES, check_rules
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.recipes import tiny_llama_pretrain_config


Mutator = Callable[[ConfigContainer], None]
ATTENTION_PLAN = {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise",
                  "layers.*.self_attn.v_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise"}


def _set(**paths: object) -> Mutator:
    def mutate(cfg: ConfigContainer) -> None:
        for path, value in paths.items():
            *parents, leaf = path.split("__")
            obj: object = cfg
            for p in parents:
                obj = getattr(obj, p)
            setattr(obj, leaf, value)

    return mutate


# rule id -> (violating mutation, world size, a path the message must name, passing mutation)
CASES: dict[str, tuple[Mutator, int, str, Mutator]] = {
    "positive_sizes": (_set(train__micro_batch_size=0), 1, "train.micro_batch_size", _set(train__micro_batch_size=2)),
    "nonnegative_values": (_set(optimizer__min_lr=1.0), 1, "optimizer.min_lr", _set(optimizer__min_lr=1e-5)),
    "world_size_divisible": (_set(model__tensor_model_parallel_size=2), 3, "model.tensor_model_parallel_size",
                             _set(model__tensor_model_parallel_size=2, dist__use_torch_fsdp2=True)),
    "global_batch_divisible": (_set(train__global_batch_size=12), 2, "train.global_batch_size",
                               _set(train__global_batch_size=24)),
    "context_parallel_seq_length": (_set(model__context_parallel_size=3), 3, "model.seq_length",
                                    _set(model__context_parallel_size=2)),
    "pipeline_layers": (_set(model__pipeline_model_parallel_size=2, model__virtual_pipeline_model_parallel_size=4), 2,
                        "model.virtual_pipeline_model_parallel_size",
                        _set(model__pipeline_model_parallel_size=2, model__virtual_pipeline_model_parallel_size=2)),
    "pipeline_layout": (_set(model__pipeline_model_parallel_size=2, model__pipeline_model_parallel_layout="Et|tL"), 2,
                        "model.pipeline_model_parallel_layout",
                        _set(model__pipeline_model_parallel_size=2, model__pipeline_model_parallel_layout="Ett|ttL")),
    "pipeline_schedule": (_set(model__pipeline_model_parallel_size=2, model__pipeline_schedule="ZBVZeroBubble"), 2,
                          "model.virtual_pipeline_model_parallel_size",
                          _set(model__pipeline_model_parallel_size=2, model__pipeline_schedule="ZBVZeroBubble",
                               model__virtual_pipeline_model_parallel_size=2)),
    "pipeline_fsdp2_reshard": (_set(model__pipeline_model_parallel_size=2,
                                    model__virtual_pipeline_model_parallel_size=2,
                                    model__pipeline_schedule="InterleavedZeroBubble", dist__use_torch_fsdp2=True,
                                    fsdp2__reshard_after_forward=True), 2, "fsdp2.reshard_after_forward",
                               _set(model__pipeline_model_parallel_size=2, dist__use_torch_fsdp2=True,
                                    fsdp2__reshard_after_forward=True)),
    "pipeline_megatron_fsdp": (_set(model__pipeline_model_parallel_size=2, dist__use_megatron_fsdp=True), 2,
                               "dist.use_megatron_fsdp", _set(dist__use_megatron_fsdp=True)),
    "pipeline_tied_embeddings": (_set(model__pipeline_model_parallel_size=2,
                                      model__virtual_pipeline_model_parallel_size=2,
                                      model__pipeline_schedule="ZBVZeroBubble",
                                      model__share_embeddings_and_output_weights=True), 2,
                                 "model.share_embeddings_and_output_weights",
                                 _set(model__pipeline_model_parallel_size=2,
                                      model__virtual_pipeline_model_parallel_size=2,
                                      model__pipeline_schedule="Interleaved1F1B",
                                      model__share_embeddings_and_output_weights=True)),
    "pipeline_ckpt_format": (_set(model__pipeline_model_parallel_size=2, checkpoint__save="/tmp/x",
                                  checkpoint__ckpt_format="torch"), 2, "checkpoint.ckpt_format",
                             _set(model__pipeline_model_parallel_size=2, checkpoint__save="/tmp/x")),
    "pipeline_fp16": (_set(model__pipeline_model_parallel_size=2, mixed_precision="fp16_mixed"), 2, "optimizer.fp16",
                      _set(model__pipeline_model_parallel_size=2, mixed_precision="bf16_mixed")),
    "tensor_parallel_heads": (_set(model__num_query_groups=3), 1, "model.num_query_groups",
                              _set(model__num_query_groups=4)),
    "sequence_parallel_needs_tp": (_set(model__sequence_parallel=True), 1, "model.sequence_parallel",
                                   _set(model__sequence_parallel=True, model__tensor_model_parallel_size=2,
                                        dist__use_torch_fsdp2=True)),
    "cpu_offloading_pipeline": (_set(model__cpu_offloading=True, model__cpu_offloading_num_layers=1,
                                     model__pipeline_model_parallel_size=2), 2, "model.cpu_offloading",
                                _set(model__cpu_offloading=True, model__cpu_offloading_num_layers=1)),
    "cpu_offloading_recompute": (_set(model__cpu_offloading=True, model__recompute_granularity="full"), 1,
                                 "model.recompute_granularity", _set(model__cpu_offloading=True)),
    "cpu_offloading_num_layers": (_set(model__cpu_offloading=True, model__cpu_offloading_num_layers=4), 1,
                                  "model.cpu_offloading_num_layers",
                                  _set(model__cpu_offloading=True, model__cpu_offloading_num_layers=3)),
    "recompute_settings": (_set(model__recompute_granularity="full", model__recompute_method="block"), 1,
                           "model.recompute_num_layers",
                           _set(model__recompute_granularity="full", model__recompute_method="block",
                                model__recompute_num_layers=2)),
    "train_length": (_set(train__train_samples=1600), 1, "train.train_samples",
                     _set(train__train_iters=None, train__train_samples=1600)),
    "run_length_fits": (_set(train__train_iters=None, train__train_samples=10**20), 1, "train.train_samples",
                        _set(train__train_iters=None, train__train_samples=10**9)),
    "model_dataset_seq_length": (_set(dataset__seq_length=64), 1, "dataset.seq_length",
                                 _set(dataset__seq_length=64, model__seq_length=64)),
    "dataset_source": (_set(dataset__data_path=["x"]), 1, "dataset.data_path",
                       _set(dataset__data_path=["x"], dataset__mock=False)),
    "dataset_split": (_set(dataset__split="0,0,0"), 1, "dataset.split", _set(dataset__split="98,2")),
    "dataset_data_path": (_set(dataset__mock=False, dataset__data_path=["0.5", "a", "x", "b"]), 1, "dataset.data_path",
                          _set(dataset__mock=False, dataset__data_path=["0.5", "a", "1", "b"])),
    "tokenizer_settings": (_set(tokenizer__add_bos=True), 1, "tokenizer.add_bos", _set(tokenizer__add_bos=False)),
    "mock_data_vocab": (_set(tokenizer__tokenizer_type="null", tokenizer__vocab_size=2), 1, "tokenizer.vocab_size",
                        _set(tokenizer__tokenizer_type="null", tokenizer__vocab_size=3)),
    "profiling_settings": (_set(profiling__use_pytorch_profiler=True, profiling__profile_step_start=5,
                                profiling__profile_step_end=4), 1, "profiling.profile_step_start",
                           _set(profiling__use_pytorch_profiler=True, profiling__profile_step_start=4,
                                profiling__profile_step_end=4)),
    "tokenizer_file": (_set(tokenizer__tokenizer_type="huggingface"), 1, "tokenizer.tokenizer_file",
                       _set(tokenizer__tokenizer_type="huggingface", tokenizer__tokenizer_file="t.json")),
    "scheduler_warmup_exclusive": (_set(scheduler__lr_warmup_iters=10), 1, "scheduler.lr_warmup_fraction",
                                   _set(scheduler__lr_warmup_fraction=None, scheduler__lr_warmup_iters=10)),
    "scheduler_wsd_decay": (_set(scheduler__lr_decay_style="WSD"), 1, "scheduler.lr_wsd_decay_iters",
                            _set(scheduler__lr_decay_style="WSD", scheduler__lr_wsd_decay_iters=50)),
    "weight_decay_schedule": (_set(scheduler__weight_decay_incr_style="linear", scheduler__start_weight_decay=0.1,
                                   scheduler__end_weight_decay=0.01), 1, "scheduler.end_weight_decay",
                              _set(scheduler__weight_decay_incr_style="linear", scheduler__start_weight_decay=0.01,
                                   scheduler__end_weight_decay=0.1)),
    "scheduler_resume_exclusive": (_set(scheduler__override_opt_param_scheduler=True,
                                        scheduler__use_checkpoint_opt_param_scheduler=True), 1,
                                   "scheduler.use_checkpoint_opt_param_scheduler",
                                   _set(scheduler__use_checkpoint_opt_param_scheduler=True)),
    "precision_exclusive": (_set(mixed_precision=None, optimizer__bf16=True, optimizer__fp16=True), 1,
                            "optimizer.fp16", _set(mixed_precision=None, optimizer__bf16=True)),
    "fsdp_backends_exclusive": (_set(dist__use_megatron_fsdp=True, dist__use_torch_fsdp2=True), 1,
                                "dist.use_torch_fsdp2", _set(dist__use_torch_fsdp2=True)),
    "megatron_fsdp_ckpt_format": (_set(dist__use_megatron_fsdp=True, checkpoint__save="/tmp/x"), 1,
                                  "checkpoint.ckpt_format",
                                  _set(dist__use_megatron_fsdp=True, checkpoint__save="/tmp/x",
                                       checkpoint__ckpt_format="fsdp_dtensor")),
    "megatron_fsdp_device_connections": (_set(dist__use_megatron_fsdp=True), 1, "dist.use_megatron_fsdp",
                                         _set(dist__use_megatron_fsdp=True)),
    "fsdp_dtensor_needs_fsdp": (_set(checkpoint__ckpt_format="fsdp_dtensor", checkpoint__save="/tmp/x"), 1,
                                "checkpoint.ckpt_format",
                                _set(checkpoint__ckpt_format="fsdp_dtensor", checkpoint__save="/tmp/x",
                                     dist__use_torch_fsdp2=True)),
    "async_save_format": (_set(checkpoint__async_save=True, checkpoint__save="/tmp/x", checkpoint__ckpt_format="torch"),
                          1, "checkpoint.ckpt_format", _set(checkpoint__async_save=True, checkpoint__save="/tmp/x")),
    "megatron_fsdp_async_save": (_set(dist__use_megatron_fsdp=True, checkpoint__save="/tmp/x",
                                      checkpoint__ckpt_format="fsdp_dtensor", checkpoint__async_save=True), 1,
                                 "checkpoint.async_save",
                                 _set(dist__use_megatron_fsdp=True, checkpoint__save="/tmp/x",
                                      checkpoint__ckpt_format="fsdp_dtensor")),
    "checkpoint_options": (_set(checkpoint__most_recent_k=0), 1, "checkpoint.most_recent_k",
                           _set(checkpoint__most_recent_k=1)),
    "fsdp2_prefetch_depths": (_set(fsdp2__fsdp2_backward_prefetch_depth=-1), 1, "fsdp2.fsdp2_backward_prefetch_depth",
                              _set(fsdp2__fsdp2_backward_prefetch_depth=0)),
    "async_tp_needs_compile": (_set(fsdp2__enable_async_tensor_parallel=True, model__tensor_model_parallel_size=2,
                                    dist__use_torch_fsdp2=True), 2, "fsdp2.enable_async_tensor_parallel",
                               _set(fsdp2__enable_async_tensor_parallel=True, model__tensor_model_parallel_size=2,
                                    fsdp2__enable_compile=True, dist__use_torch_fsdp2=True)),
    "activation_checkpointing_scope": (_set(fsdp2__activation_checkpointing_scope=["all", "vision"]), 1,
                                       "fsdp2.activation_checkpointing_scope",
                                       _set(fsdp2__activation_checkpointing_scope=["language", "vision"])),
    "activation_checkpointing_single_knob": (_set(model__recompute_granularity="full",
                                                  ddp__activation_checkpointing="selective"), 1,
                                             "ddp.activation_checkpointing",
                                             _set(ddp__activation_checkpointing="selective")),
    "tokenizer_vocab_fits": (_set(tokenizer__extra_special_tokens=["<x>"]), 1, "model.vocab_size",
                             _set(tokenizer__extra_special_tokens=["<x>"], model__vocab_size=259)),
    "field_types": (_set(ddp__data_parallel_sharding_strategy="zero3"), 1, "ddp.data_parallel_sharding_strategy",
                    _set(ddp__data_parallel_sharding_strategy="optim")),
    "model_family": (_set(model__family="mistrall"), 1, "model.family", _set(model__family="qwen3",
                                                                          model__qk_layernorm=True)),
    "attention_window": (_set(model__window_size=(31, 4)), 1, "model.window_size",
                         _set(model__window_size=(31, 0), model__window_attn_skip_freq=[1, 0, 1, 0])),
    "yarn_rope": (_set(model__position_embedding_type="yarn", model__rope_scaling=True), 1, "model.rope_scaling",
                  _set(model__position_embedding_type="yarn", model__yarn_rotary_scaling_factor=4.0)),
    "per_layer_rope": (_set(model__rotary_base_local=10000.0), 1, "model.rotary_base_local",
                       _set(model__rotary_base_local=10000.0, model__window_size=(7, 0), model__window_attn_skip_freq=2,
                            model__seq_len_interpolation_factor=8.0)),
    "attention_sinks": (_set(model__softmax_type="learnable", model__context_parallel_size=2,
                             model__cp_comm_type="p2p"), 2, "model.cp_comm_type",
                        _set(model__softmax_type="learnable", model__context_parallel_size=2)),
    "logit_softcapping": (_set(model__attn_logit_softcapping=50.0, model__context_parallel_size=2,
                               model__cp_comm_type="p2p"), 2, "model.cp_comm_type",
                          _set(model__attn_logit_softcapping=50.0, model__final_logit_softcapping=30.0,
                               model__context_parallel_size=2)),
    "model_head_dim": (_set(model__hidden_size=130), 1, "model.num_attention_heads",
                       _set(model__hidden_size=130, model__kv_channels=32)),
    "rope_scaling": (_set(model__rope_scaling=True, model__rope_low_freq_factor=5.0), 1, "model.rope_high_freq_factor",
                     _set(model__rope_scaling=True)),
    "cpu_offloading_weights": (_set(model__cpu_offloading=True, model__cpu_offloading_weights=True), 1,
                               "model.cpu_offloading_weights", _set(model__cpu_offloading=True)),
    "transformer_impl_available": (_set(model__transformer_impl="transformer_engine"), 1, "model.transformer_impl",
                                   _set(model__transformer_impl="local")),
    "engine_available": (_set(model__engine="megatron_core"), 1, "model.engine", _set(model__engine="megatron_core")),
    "multi_latent_attention": (_set(model__multi_latent_attention=True, model__context_parallel_size=2,
                                    model__cp_comm_type="p2p"), 2, "model.cp_comm_type",
                               _set(model__multi_latent_attention=True, model__q_lora_rank=None, model__qk_head_dim=8,
                                    model__qk_pos_emb_head_dim=4, model__v_head_dim=8, model__kv_lora_rank=16)),
    "multi_token_prediction": (_set(model__mtp_num_layers=1, model__pipeline_model_parallel_size=2), 2,
                               "model.pipeline_model_parallel_size", _set(model__mtp_num_layers=2)),
    "megatron_core_mla": (_set(model__engine="megatron_core", model__multi_latent_attention=True), 1,
                          "model.multi_latent_attention", _set(model__multi_latent_attention=True)),
    "megatron_core_context_parallel": (_set(model__engine="megatron_core", model__context_parallel_size=2), 2,
                                       "model.context_parallel_size", _set(model__engine="megatron_core")),
    "megatron_core_features": (_set(model__engine="megatron_core", model__init_model_with_meta_device=True), 1,
                               "model.init_model_with_meta_device",
                               _set(model__engine="megatron_core", model__tensor_model_parallel_size=2)),
    "megatron_core_sequence_parallel": (_set(model__engine="megatron_core", model__tensor_model_parallel_size=2,
                                             model__sequence_parallel=True), 2, "model.sequence_parallel",
                                        _set(model__engine="megatron_core", model__tensor_model_parallel_size=2)),
    "megatron_core_pipeline": (_set(model__engine="megatron_core", model__pipeline_model_parallel_size=2,
                                    model__virtual_pipeline_model_parallel_size=2,
                                    model__pipeline_schedule="ZBVZeroBubble"), 2, "model.pipeline_schedule",
                               _set(model__engine="megatron_core", model__pipeline_model_parallel_size=2,
                                    model__virtual_pipeline_model_parallel_size=2)),
    "megatron_core_fsdp": (_set(model__engine="megatron_core", dist__use_torch_fsdp2=True,
                                model__share_embeddings_and_output_weights=True), 1,
                           "model.share_embeddings_and_output_weights",
                           _set(model__engine="megatron_core", dist__use_torch_fsdp2=True)),
    "megatron_core_ddp_options": (_set(model__engine="megatron_core", ddp__bucket_cap_mb=25.0), 1,
                                  "ddp.bucket_cap_mb",
                                  _set(model__engine="megatron_core", ddp__bucket_size=40_000_000)),
    "megatron_core_precision": (_set(model__engine="megatron_core", mixed_precision=None,
                                     model__params_dtype="bfloat16"), 1, "model.params_dtype",
                                _set(model__engine="megatron_core", mixed_precision="bf16_mixed")),
    "engine_parallel_layout": (_set(model__expert_model_parallel_size=2), 2, "model.expert_model_parallel_size",
                               _set(model__expert_model_parallel_size=1)),
    "megatron_fsdp_expert_tensor_parallel": (
        _set(model__num_moe_experts=4, model__tensor_model_parallel_size=2, dist__use_megatron_fsdp=True), 2,
        "model.expert_tensor_parallel_size",
        _set(model__num_moe_experts=4, model__tensor_model_parallel_size=2, dist__use_megatron_fsdp=True,
             model__expert_tensor_parallel_size=1)),
    "tensor_parallel_divisible": (_set(model__tensor_model_parallel_size=2, dist__use_torch_fsdp2=True,
                                       model__ffn_hidden_size=351), 2, "model.ffn_hidden_size",
                                  _set(model__tensor_model_parallel_size=2, dist__use_torch_fsdp2=True)),
    "tp_plan_styles": (_set(fsdp2__tp_plan={"layers.*.mlp.up_proj": "sequence_parallel"}), 1, "fsdp2.tp_plan",
                       _set(fsdp2__tp_plan={"layers.*.mlp.up_proj": "colwise"})),
    "autocast_dtype": (_set(ddp__autocast_dtype="float32"), 1, "ddp.autocast_dtype",
                       _set(ddp__autocast_dtype="bfloat16")),
    "megatron_fsdp_meta_init": (_set(dist__use_megatron_fsdp=True, model__init_model_with_meta_device=True), 1,
                                "model.init_model_with_meta_device",
                                _set(dist__use_megatron_fsdp=True, model__init_model_with_meta_device=True,
                                     ddp__data_parallel_sharding_strategy="optim_grads_params")),
    "megatron_fsdp_unit_modules": (_set(dist__use_megatron_fsdp=True, ddp__megatron_fsdp_unit_modules=[]), 1,
                                   "ddp.megatron_fsdp_unit_modules",
                                   _set(dist__use_megatron_fsdp=True, ddp__megatron_fsdp_unit_modules=None)),
    "moe_router": (_set(model__num_moe_experts=4, model__moe_router_topk=5), 1, "model.moe_router_topk",
                   _set(model__num_moe_experts=4, model__moe_router_topk=4)),
    "moe_sizes": (_set(model__num_moe_experts=4, model__moe_ffn_hidden_size=0), 1, "model.moe_ffn_hidden_size",
                  _set(model__num_moe_experts=4, model__moe_ffn_hidden_size=64)),
    "moe_router_groups": (_set(model__num_moe_experts=8, model__moe_router_num_groups=4,
                                model__moe_router_group_topk=1, model__moe_router_topk=4), 1,
                          "model.moe_router_group_topk",
                          _set(model__num_moe_experts=8, model__moe_router_num_groups=4,
                               model__moe_router_group_topk=2, model__moe_router_topk=4)),
    "moe_losses": (_set(model__num_moe_experts=4, model__moe_aux_loss_coeff=-0.1), 1, "model.moe_aux_loss_coeff",
                   _set(model__num_moe_experts=4, model__moe_aux_loss_coeff=0.1)),
    "moe_layer_freq": (_set(model__num_moe_experts=4, model__moe_layer_freq=[0, 1]), 1, "model.moe_layer_freq",
                       _set(model__num_moe_experts=4, model__moe_layer_freq=[0, 1, 1, 1])),
    "moe_clamped_glu": (_set(model__activation_func_clamp_value=7.0), 1, "model.activation_func_clamp_value",
                        _set(model__num_moe_experts=4, model__activation_func_clamp_value=7.0,
                             model__glu_linear_offset=1.0)),
    "moe_expert_bias": (_set(model__num_moe_experts=4, model__add_bias_linear=True,
                             model__tensor_model_parallel_size=2), 2, "model.expert_tensor_parallel_size",
                        _set(model__num_moe_experts=4, model__add_bias_linear=True, model__tensor_model_parallel_size=2,
                             model__expert_tensor_parallel_size=1, dist__use_torch_fsdp2=True)),
    "moe_dropless": (_set(model__num_moe_experts=4, model__moe_expert_capacity_factor=1.0), 1,
                     "model.moe_expert_capacity_factor", _set(model__num_moe_experts=4)),
    "expert_parallel_layout": (_set(model__num_moe_experts=6, model__expert_model_parallel_size=4), 4,
                               "model.num_moe_experts",
                               _set(model__num_moe_experts=8, model__expert_model_parallel_size=1)),
    "expert_tensor_parallel": (_set(model__num_moe_experts=4, model__tensor_model_parallel_size=2,
                                    model__expert_tensor_parallel_size=3), 2,
                               "model.expert_tensor_parallel_size",
                               _set(model__num_moe_experts=4, model__tensor_model_parallel_size=2,
                                    model__expert_tensor_parallel_size=1, dist__use_torch_fsdp2=True)),
    "moe_dispatcher": (_set(model__num_moe_experts=4, model__expert_model_parallel_size=2,
                            model__moe_token_dispatcher_type="allgather"), 2, "model.moe_token_dispatcher_type",
                       _set(model__num_moe_experts=4, model__moe_token_dispatcher_type="allgather")),
    "moe_backend": (_set(model__num_moe_experts=4, dist__use_megatron_fsdp=True, model__engine="megatron_core"), 1,
                    "dist.use_megatron_fsdp", _set(model__num_moe_experts=4, dist__use_megatron_fsdp=True)),
    "quantization_needs_modelopt": (_set(quantization__quant_cfg="int8"), 1, "quantization.quant_cfg",
                                    _set(quantization__quant_cfg="int8")),
    "quantization_cuda_formats": (_set(quantization__quant_cfg="nvfp4"), 1, "quantization.quant_cfg",
                                  _set(quantization__quant_cfg="fp8")),
    "quantization_settings": (_set(quantization__quant_cfg="int8", quantization__calib_size=0), 1,
                              "quantization.calib_size", _set(quantization__quant_cfg="int4_awq")),
    "distillation_needs_modelopt": (_set(distillation__teacher_checkpoint="/tmp/teacher"), 1,
                                    "distillation.teacher_checkpoint",
                                    _set(distillation__teacher_checkpoint="/tmp/teacher")),
    "distillation_settings": (_set(distillation__teacher_checkpoint="/tmp/t", distillation__logit_kl_temperature=0.0),
                              1, "distillation.logit_kl_temperature",
                              _set(distillation__teacher_checkpoint="/tmp/t", distillation__skip_lm_loss=False)),
    "fp8_fp4_settings": (lambda cfg: setattr(cfg, "mixed_precision", MixedPrecisionConfig(fp8="hybrid", fp4="e2m1")),
                         1, "mixed_precision.fp4", _set(mixed_precision="bf16_mixed")),
    "fp8_bf16_layers": (lambda cfg: setattr(cfg, "mixed_precision", MixedPrecisionConfig(
        first_last_layers_bf16=True, num_layers_at_start_in_bf16=2, num_layers_at_end_in_bf16=2)), 1,
        "mixed_precision.num_layers_at_end_in_bf16", lambda cfg: setattr(cfg, "mixed_precision", MixedPrecisionConfig(
            first_last_layers_bf16=True, num_layers_at_start_in_bf16=1, num_layers_at_end_in_bf16=1))),
    "mxfp8_param_gather_reuse": (lambda cfg: setattr(cfg, "mixed_precision", _mxfp8_without_reuse()), 1,
                                 "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag", _set(mixed_precision="fp32")),
    "fp8_requirements": (_set(mixed_precision="bf16_with_fp8_delayed_scaling_mixed"), 1, "mixed_precision",
                         _set(mixed_precision="bf16_mixed")),
    "fp8_local_compat": (lambda cfg: (_emulated_fp8(cfg), _set(quantization__quant_cfg="int8")(cfg)), 1,
                         "quantization.quant_cfg",
                         lambda cfg: (_emulated_fp8(cfg), _set(dist__use_torch_fsdp2=True)(cfg))),
    "data_index_fits_memory": (_set(dataset__mock=False, dataset__data_path=["/tmp/corpus_text_document"],
                                    train__train_iters=2**31 - 1, train__global_batch_size=2**20), 1,
                               "train.train_iters",  # 2**51 samples: no machine holds their index
                               _set(train__train_iters=2**31 - 1, train__global_batch_size=2**20)),  # mock: no index
    "output_paths": (_set(checkpoint__save="/proc/self/ckpt"), 1, "checkpoint.save",
                     _set(checkpoint__save="/tmp/megatron_bridge_rules_case/ckpt")),
    "nccl_needs_cuda": (_set(dist__distributed_backend="nccl"), 1, "dist.distributed_backend",
                        _set(dist__distributed_backend="gloo")),
    "cp_ring_needs_cuda": (_set(model__context_parallel_size=2, model__cp_comm_type="p2p"), 2, "model.cp_comm_type",
                           _set(model__context_parallel_size=2, model__cp_comm_type="all_gather")),
    "fsdp2_pin_memory_needs_accelerator": (
        _set(dist__use_torch_fsdp2=True, fsdp2__offload_policy=FSDP2OffloadPolicy(pin_memory=True)), 1,
        "fsdp2.offload_policy.pin_memory",
        _set(dist__use_torch_fsdp2=True, fsdp2__offload_policy=FSDP2OffloadPolicy(pin_memory=False))),
    "tp_plan_matches_model": (
        _set(dist__use_torch_fsdp2=True, model__tensor_model_parallel_size=2, fsdp2__tp_plan={"mlp.*": "colwise"}), 2,
        "fsdp2.tp_plan",
        _set(dist__use_torch_fsdp2=True, model__tensor_model_parallel_size=2, fsdp2__tp_plan=ATTENTION_PLAN)),
}

NOT_YET_BUILT = "engine_parallel_layout"
"""Passing cases of layout rules (PP, CP) may still violate this rule until those layouts are built."""

NO_MODELOPT_RULES = ("quantization_needs_modelopt", "distillation_needs_modelopt")
"""Rules whose violation needs nvidia-modelopt to be missing: the test makes its import fail."""
NO_MEGATRON_CORE_RULES = ("engine_available",)
"""Rules whose violation needs megatron-core to be missing: the test makes its import fail."""
MEGATRON_CORE_PASSING = ("engine_available", "megatron_core_context_parallel", "megatron_core_features",
                         "megatron_core_pipeline", "megatron_core_fsdp", "megatron_core_sequence_parallel",
                         "megatron_core_precision", "megatron_core_ddp_options")
"""Rules whose passing case builds the megatron-core engine: skipped where megatron-core does not import."""
NO_APEX_RULES = ("megatron_core_sequence_parallel",)
"""Rules whose violation needs Apex to be missing: the test makes its import fail (megatron-core's import stays)."""


def _emulated_fp8(cfg: ConfigContainer) -> None:
    mp = bf16_with_fp8_current_scaling_mixed()
    mp.fp8_emulate = True  # torchao's FP8 casts with high-precision GEMMs: valid on CPU
    cfg.mixed_precision = mp


def _mxfp8_without_reuse() -> MixedPrecisionConfig:
    mp = bf16_with_mxfp8_mixed()
    mp.reuse_grad_buf_for_mxfp8_param_ag = False
    return mp


def _as_cpu_machine(monkeypatch: pytest.MonkeyPatch, rule_id: str) -> None:
    """No CUDA device (so the CUDA rules fail on a GPU machine too); no modelopt for the modelopt rules."""
    import megatron_bridge.utils.packages as packages

    monkeypatch.setattr(packages, "cuda_capability", lambda: None)
    monkeypatch.setattr(packages, "accelerator_available", lambda: False)
    if rule_id in NO_MODELOPT_RULES + NO_MEGATRON_CORE_RULES:
        monkeypatch.setattr(packages, "import_problem", lambda name: "not installed")
    if rule_id in NO_APEX_RULES:
        real = packages.import_problem
        monkeypatch.setattr(packages, "import_problem", lambda name: "not installed" if name == "apex" else real(name))


def test_every_rule_has_a_case() -> None:
    check_rules(tiny_llama_pretrain_config().finalize(), 1)  # registers the distributed rules too
    assert sorted(CASES) == sorted(r.id for r in RULES)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_violation_is_named(rule_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    mutate, world_size, path, _ = CASES[rule_id]
    if rule_id == "megatron_fsdp_device_connections":
        monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    _as_cpu_machine(monkeypatch, rule_id)
    cfg = tiny_llama_pretrain_config()
    mutate(cfg)
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=world_size)
    assert f"[rule {rule_id}]" in str(info.value)
    assert path in str(info.value)
    assert path in info.value.paths
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_passing_case(rule_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, _, ok = CASES[rule_id]
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    if rule_id in MEGATRON_CORE_PASSING:
        pytest.importorskip("megatron.core", reason="the megatron-core engine needs megatron-core (Python 3.12)")
    cfg = tiny_llama_pretrain_config()
    ok(cfg)
    m = cfg.model
    world_size = m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size
    try:
        cfg.validate(world_size=world_size)
    except ConfigValidationError as exc:
        assert set(re.findall(r"\[rule (\w+)\]", str(exc))) == {NOT_YET_BUILT}, exc
        assert rule_id != NOT_YET_BUILT


def test_context_parallel_seq_length_with_sequence_parallel() -> None:
    """With sequence parallelism each CP slice is split again over TP: seq_length % (2 × CP × TP) == 0."""
    cfg = tiny_llama_pretrain_config(seq_length=68, context_parallel_size=2, tensor_model_parallel_size=2,
                                     sequence_parallel=True, use_torch_fsdp2=True, global_batch_size=16)
    with pytest.raises(ConfigValidationError, match=r"divisible by 2×model.context_parallel_size×model.tensor_model_"
                       r"parallel_size = 2×2×2 = 8 .*\[rule context_parallel_seq_length\]"):
        cfg.validate(world_size=4)
    cfg.model.sequence_parallel = False
    cfg.validate(world_size=4)  # 68 = 17 × (2 × 2): the zig-zag layout alone only needs 2 × CP


def test_all_violations_reported_together() -> None:
    cfg = tiny_llama_pretrain_config()
    cfg.train.micro_batch_size = 0
    cfg.dataset.seq_length = 64
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=1)
    assert "2 config problems" in str(info.value)
    assert {"train.micro_batch_size", "dataset.seq_length"} <= set(info.value.paths)


def test_world_size_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron_bridge.utils import dist_env

    monkeypatch.setattr(dist_env, "_dist_initialized", lambda: False)  # another test's process group may be alive
    cfg = tiny_llama_pretrain_config(global_batch_size=12)
    monkeypatch.setenv("WORLD_SIZE", "1")
    cfg.validate()
    monkeypatch.setenv("WORLD_SIZE", "8")  # 12 is not divisible by micro-batch 4 x DP 8
    with pytest.raises(ConfigValidationError, match="global_batch_divisible"):
        cfg.validate()


def test_custom_tp_plan_sharding_an_attention_partly_is_refused_by_validate() -> None:
    """The head split of set-up (distributed/tensor_parallel.py) is checked on a meta-device model in validate()."""
    cfg = tiny_llama_pretrain_config(tensor_model_parallel_size=2, use_torch_fsdp2=True)
    cfg.fsdp2.tp_plan = {"layers.*.self_attn.q_proj": "colwise"}
    with pytest.raises(ConfigValidationError, match=r"shards layers\.0\.self_attn partly") as info:
        cfg.validate(world_size=2)
    assert "[rule tp_plan_matches_model]" in str(info.value) and info.value.paths == ("fsdp2.tp_plan",)


def test_seed_megatron_fsdp_example_validates_with_llama3_8b_cp2() -> None:
    """The seed's example recipe fix-up (megatron-fsdp-skill): llama3_8b_pretrain_config() and the five Megatron FSDP
    overrides validate on 8 ranks with the recipe's CP=2 (Megatron FSDP shards over dp × cp = 4 × 2)."""
    from megatron_bridge.recipes import llama3_8b_pretrain_config

    cfg = llama3_8b_pretrain_config()
    cfg.dist.use_megatron_fsdp = True
    cfg.ddp.use_megatron_fsdp = True
    cfg.ddp.data_parallel_sharding_strategy = "optim_grads_params"
    cfg.ddp.average_in_collective = False
    cfg.checkpoint.ckpt_format = "fsdp_dtensor"
    cfg.checkpoint.save = "/tmp/fsdp_ckpts"
    cfg.checkpoint.load = None
    cfg.validate(world_size=8)
    assert cfg.model.context_parallel_size == 2 and cfg.data_parallel_size(8) == 4


def test_megatron_fsdp_context_parallel_on_megatron_core_needs_transformer_engine() -> None:
    """What stays refused: on model.engine='megatron_core', context parallelism (with Megatron FSDP too) runs only in
    transformer-engine's attention (rule megatron_core_context_parallel); no Megatron FSDP rule refuses CP."""
    cfg = tiny_llama_pretrain_config(context_parallel_size=2)
    cfg.dist.use_megatron_fsdp = True
    cfg.model.engine = "megatron_core"
    with pytest.raises(ConfigValidationError) as exc:
        cfg.validate(world_size=2)
    assert set(re.findall(r"\[rule (\w+)\]", str(exc.value))) == {"megatron_core_context_parallel"}, exc.value
