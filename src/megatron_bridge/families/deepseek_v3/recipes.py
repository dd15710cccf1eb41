"""DeepSeek-V3 family recipes: Megatron-Bridge's DeepSeek-V3 (671B) and Moonlight-16B-A3B pretraining recipes
(``recipes/deepseek/h100/deepseek_v3.py``, ``recipes/moonlight/h100/moonlight_16b.py`` at 067f987) with the models'
Hugging Face shapes, and ``tiny_deepseek_v3``, the CPU-sized model. What they leave out here (multi-token
prediction, which Megatron-Bridge's DeepSeek-V3 recipes turn on with an MTP pipeline stage and this version builds at
PP=1 only, the flex/DeepEP dispatchers, transformer-engine kernels, bf16 parameters and the precision-aware optimizer)
is docs/models/deepseek-v3.md."""

from typing import Any

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.mixed_precision import MixedPrecisionConfig
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.recipes.base import RecipeInfo, apply_common_overrides, pretrain_common
from megatron_bridge.recipes.tiny import tiny_moe_pretrain_config


def deepseek_v3_model(**layout: Any) -> ModelConfig:
    """DeepSeek-V3 671B (Hugging Face ``deepseek-ai/DeepSeek-V3``): 61 layers (3 dense), hidden 7168, 128 heads with
    MLA (q latent 1536, kv latent 512, heads 128 + 64 RoPE, values 128), YaRN ×40 from 4096, 256 experts of width
    2048 top-8 in 8 groups (4 kept), one shared expert, routed scaling 2.5; Megatron-Bridge's init std 0.006 and
    sequence aux loss 1e-4."""
    return ModelConfig(
        family="deepseek_v3", num_layers=61, hidden_size=7168, ffn_hidden_size=18432, num_attention_heads=128,
        vocab_size=129280, make_vocab_size_divisible_by=1280, seq_length=4096, max_position_embeddings=163840,
        layernorm_epsilon=1e-6, init_method_std=0.006, multi_latent_attention=True, q_lora_rank=1536,
        kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128, rotary_base=10000.0,
        position_embedding_type="yarn", yarn_rotary_scaling_factor=40.0, yarn_original_max_position_embeddings=4096,
        yarn_mscale=1.0, yarn_mscale_all_dim=1.0, **_deepseek_moe(256, 2048, 8, 2048, 3, 61, 2.5, (8, 4), 1e-4),
        **layout)


def moonlight_16b_model(**layout: Any) -> ModelConfig:
    """Moonlight-16B-A3B (``moonshotai/Moonlight-16B-A3B``): 27 layers (1 dense), hidden 2048, 16 heads with MLA
    without a query latent (kv latent 512, heads 128 + 64 RoPE, values 128), RoPE base 50000 (no YaRN), 64 experts
    of width 1408 top-6 in one group, two shared experts, routed scaling 2.446, aux loss 1e-3."""
    return ModelConfig(
        family="deepseek_v3", num_layers=27, hidden_size=2048, ffn_hidden_size=11264, num_attention_heads=16,
        vocab_size=163840, make_vocab_size_divisible_by=1280, seq_length=4096, max_position_embeddings=8192,
        layernorm_epsilon=1e-5, multi_latent_attention=True, q_lora_rank=None, kv_lora_rank=512, qk_head_dim=128,
        qk_pos_emb_head_dim=64, v_head_dim=128, rotary_base=50000.0,
        **_deepseek_moe(64, 1408, 6, 2 * 1408, 1, 27, 2.446, (1, 1), 1e-3), **layout)


def _deepseek_moe(experts: int, width: int, topk: int, shared: int, dense: int, layers: int, scale: float,
                  groups: tuple[int, int], aux: float) -> dict[str, Any]:
    """The experts as Megatron-Bridge's DeepSeek provider sets them: sigmoid routing with the expert bias (update
    rate 1e-3), sequence aux loss, grouped GEMM, alltoall dispatch, experts whole on each TP rank."""
    return {"num_moe_experts": experts, "moe_ffn_hidden_size": width, "moe_router_topk": topk,
            "moe_shared_expert_intermediate_size": shared, "moe_layer_freq": [0] * dense + [1] * (layers - dense),
            "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
            "moe_router_bias_update_rate": 1e-3, "moe_router_topk_scaling_factor": scale,
            "moe_router_num_groups": groups[0], "moe_router_group_topk": groups[1],
            "moe_router_load_balancing_type": "seq_aux_loss", "moe_aux_loss_coeff": aux, "moe_grouped_gemm": True,
            "moe_token_dispatcher_type": "alltoall", "expert_tensor_parallel_size": 1}


def tiny_deepseek_v3_pretrain_config(**overrides: Any) -> ConfigContainer:
    """The tiny MoE's data, optimizer and schedule with DeepSeek-V3's architecture at CPU size: 4 layers (the first
    dense, width 352), hidden 128, 4 MLA heads (q latent 64, kv latent 32, heads 32 + 16 RoPE, values 32), YaRN ×4
    from 32 tokens, 8 experts of width 96 top-2 in 4 groups (2 kept), one shared expert, routed scaling 2.5, expert
    bias and sequence aux loss 1e-2; expert parallelism over 2 ranks (``expert_model_parallel_size=1`` for one
    process)."""
    cfg = tiny_moe_pretrain_config()
    m = cfg.model
    m.family, m.num_query_groups, m.layernorm_epsilon = "deepseek_v3", None, 1e-6
    m.multi_latent_attention, m.q_lora_rank, m.kv_lora_rank = True, 64, 32
    m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim = 32, 16, 32
    m.position_embedding_type, m.yarn_rotary_scaling_factor, m.yarn_original_max_position_embeddings = "yarn", 4.0, 32
    m.yarn_mscale, m.yarn_mscale_all_dim = 1.0, 1.0
    for name, value in _deepseek_moe(8, 96, 2, 96, 1, m.num_layers, 2.5, (4, 2), 1e-2).items():
        setattr(m, name, value)
    m.expert_model_parallel_size = 2
    return apply_common_overrides(cfg, **overrides)


def _deepseek_training(cfg: ConfigContainer, *, iters: int, gbs: int, warmup: int, save: int) -> ConfigContainer:
    """The training values Megatron-Bridge's DeepSeek-V3 and Moonlight recipes change from ``_pretrain_common``:
    micro-batch 1, eval every 2000 steps, the schedule's warmup, garbage collection every 5 steps, bf16 with
    gradients reduced in bf16 (their MixedPrecisionConfig; their bf16 parameters and precision-aware optimizer are
    not built here: fp32 master weights), pipeline activations in bf16."""
    cfg.train.train_iters, cfg.train.global_batch_size, cfg.train.micro_batch_size = iters, gbs, 1
    cfg.train.manual_gc, cfg.train.manual_gc_interval = True, 5
    cfg.validation.eval_interval = 2000
    cfg.scheduler.lr_warmup_iters = warmup
    cfg.checkpoint.save_interval = save
    cfg.model.pipeline_dtype = "bfloat16"
    cfg.mixed_precision = MixedPrecisionConfig(bf16=True, grad_reduce_in_fp32=False)
    cfg.ddp.grad_reduce_in_fp32 = False
    return cfg


def _deepseek_v3_layout(first: int, middle: int, stages: int, last: int) -> list[list[str]]:
    """Megatron-Bridge's DeepSeek-V3 pipeline layout without its MTP layer: the embedding and ``first`` layers,
    ``stages`` stages of ``middle`` layers, then ``last`` layers and the loss."""
    return [["embedding"] + ["decoder"] * first, *([["decoder"] * middle] * stages), ["decoder"] * last + ["loss"]]


def deepseek_v3_pretrain_1024gpu_h100_bf16_config(**overrides: Any) -> ConfigContainer:
    """DeepSeek-V3 671B on 1024 H100s (Megatron-Bridge's ``deepseek_v3_pretrain_1024gpu_h100_bf16_config``): TP2 PP16
    EP64 with sequence parallelism, 4096 tokens, global batch 4096, 1M steps with 2000 warmup steps, no recompute.
    Megatron-Bridge's pipeline layout (the embedding and 4 layers, 14 stages of 4, the last layer with the loss)
    without its MTP layer (multi-token prediction is built at PP=1 only)."""
    model = deepseek_v3_model(tensor_model_parallel_size=2, pipeline_model_parallel_size=16,
                              expert_model_parallel_size=64, sequence_parallel=True,
                              pipeline_model_parallel_layout=_deepseek_v3_layout(4, 4, 14, 1))
    cfg = _deepseek_training(pretrain_common(model), iters=1_000_000, gbs=4096, warmup=2000, save=2000)
    return apply_common_overrides(cfg, **overrides)


def deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config(**overrides: Any) -> ConfigContainer:
    """DeepSeek-V3 671B on 32 nodes of 8 H100s (``deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config``): TP2 PP8
    EP32 with sequence parallelism and full uniform recompute of every layer, Megatron-Bridge's PP8 layout (the
    embedding and 8 layers, 6 stages of 8, 5 layers with the loss; no MTP); otherwise the 1024-GPU recipe."""
    model = deepseek_v3_model(tensor_model_parallel_size=2, pipeline_model_parallel_size=8,
                              expert_model_parallel_size=32, sequence_parallel=True,
                              pipeline_model_parallel_layout=_deepseek_v3_layout(8, 8, 6, 5),
                              recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    cfg = _deepseek_training(pretrain_common(model), iters=1_000_000, gbs=4096, warmup=2000, save=2000)
    return apply_common_overrides(cfg, **overrides)


def moonlight_16b_pretrain_8gpu_h100_bf16_config(**overrides: Any) -> ConfigContainer:
    """Moonlight-16B-A3B on 8 H100s (``moonlight_16b_pretrain_8gpu_h100_bf16_config``): TP2 EP8 with sequence
    parallelism and selective recompute, 4096 tokens, global batch 2048, 500k steps with 2000 warmup steps, the
    dataset split 99990/8/2."""
    model = moonlight_16b_model(tensor_model_parallel_size=2, expert_model_parallel_size=8, sequence_parallel=True,
                                recompute_granularity="selective")
    cfg = _deepseek_training(pretrain_common(model), iters=500_000, gbs=2048, warmup=2000, save=2000)
    cfg.dataset.split = "99990,8,2"
    cfg.scheduler.lr_decay_iters = cfg.train.train_iters
    return apply_common_overrides(cfg, **overrides)


def moonlight_16b_pretrain_16gpu_h100_bf16_config(**overrides: Any) -> ConfigContainer:
    """Moonlight-16B-A3B on 16 H100s (``moonlight_16b_pretrain_16gpu_h100_bf16_config``, Megatron-Bridge's bounded
    convergence run): TP1 EP8 without recompute, 100 steps of 1024 samples in micro-batches of 2, 40 warmup steps,
    a checkpoint every 50."""
    cfg = moonlight_16b_pretrain_8gpu_h100_bf16_config()
    m = cfg.model
    m.tensor_model_parallel_size, m.sequence_parallel, m.recompute_granularity = 1, False, None
    cfg.dist.use_torch_fsdp2 = False
    cfg.train.train_iters, cfg.train.global_batch_size, cfg.train.micro_batch_size = 100, 1024, 2
    cfg.scheduler.lr_warmup_iters, cfg.scheduler.lr_decay_iters, cfg.checkpoint.save_interval = 40, 100, 50
    return apply_common_overrides(cfg, **overrides)


RECIPES = {
    "deepseek_v3": RecipeInfo(deepseek_v3_pretrain_1024gpu_h100_bf16_config, 1024),
    "deepseek_v3_32nodes": RecipeInfo(deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config, 256),
    "moonlight_16b": RecipeInfo(moonlight_16b_pretrain_8gpu_h100_bf16_config, 8),
    "moonlight_16b_16gpu": RecipeInfo(moonlight_16b_pretrain_16gpu_h100_bf16_config, 16),
    "tiny_deepseek_v3": RecipeInfo(tiny_deepseek_v3_pretrain_config, 2),
}
"""The family's recipes (short name → function and the world size its layout is meant for: Megatron-Bridge's, EP
folded over TP as there)."""
