"""Multi-latent attention (``models/mla.py``) against transformers' ``DeepseekV3Attention``: the same weights give the
same output (fp32, 1e-6) with and without the query latent, under YaRN with its softmax-scale correction; the model
with MLA builds, runs forward/backward and names its tensor-parallel split."""

import pytest
import torch

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.models.layers import RotaryEmbedding, yarn_mscale
from megatron_bridge.models.llama import LlamaModel, _linear
from megatron_bridge.models.mla import MultiLatentAttention, mla_softmax_scale


_YARN_HF = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
            "mscale": 0.707, "mscale_all_dim": 0.5, "beta_fast": 32.0, "beta_slow": 1.0}
_YARN_OURS = {"position_embedding_type": "yarn", "yarn_rotary_scaling_factor": 4.0, "rotary_base": 10000.0,
              "yarn_original_max_position_embeddings": 16, "yarn_mscale": 0.707, "yarn_mscale_all_dim": 0.5}


def _ours(q_lora_rank: int | None, **extra: object) -> ModelConfig:
    return ModelConfig(hidden_size=32, num_attention_heads=4, multi_latent_attention=True, q_lora_rank=q_lora_rank,
                       kv_lora_rank=12, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=6, layernorm_epsilon=1e-6,
                       **extra)


@pytest.mark.parametrize("q_lora_rank", [16, None])
def test_mla_matches_transformers(q_lora_rank: int | None) -> None:
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    torch.manual_seed(0)
    hf_cfg = DeepseekV3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=q_lora_rank,
                              kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
                              rope_parameters=_YARN_HF, max_position_embeddings=64)
    hf_cfg._attn_implementation = "eager"
    hf = DeepseekV3Attention(hf_cfg, 0).eval()
    for p in hf.parameters():
        torch.nn.init.normal_(p, 0.0, 0.2)
    config = _ours(q_lora_rank, **_YARN_OURS)
    ours = MultiLatentAttention(config, dtype=torch.float32, linear=_linear).to_empty(device="cpu")
    ours.load_state_dict(hf.state_dict())
    x, pos = torch.randn(2, 24, 32), torch.arange(24)[None]
    mask = torch.full((24, 24), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        want = hf(x, DeepseekV3RotaryEmbedding(hf_cfg)(x, pos), mask)[0]
        got = ours(x, *RotaryEmbedding(config)(pos))
    assert ours.softmax_scale == pytest.approx(hf.scaling, rel=1e-12)
    assert (got - want).abs().max() <= 1e-6


def test_softmax_scale_has_the_yarn_correction() -> None:
    plain = _ours(16)
    assert mla_softmax_scale(plain) == 12 ** -0.5
    assert mla_softmax_scale(_ours(16, **_YARN_OURS)) == pytest.approx(12 ** -0.5 * yarn_mscale(4.0, 0.5) ** 2)


@pytest.mark.parametrize("q_lora_rank", [16, None])
def test_model_with_mla_trains_and_names_its_split(q_lora_rank: int | None) -> None:
    config = _ours(q_lora_rank, num_layers=2, vocab_size=64)
    torch.manual_seed(0)
    model = LlamaModel(config, device="cpu")
    tokens = torch.randint(0, 64, (2, 16))
    loss = model(tokens, labels=tokens).mean()
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters())
    styles = model.layers[0].self_attn.tensor_parallel_styles()
    q = {"q_proj": "colwise"} if q_lora_rank is None else {"q_a_proj": "replicate", "q_a_layernorm": "replicate",
                                                           "q_b_proj": "colwise"}
    assert styles == {**q, "kv_a_proj_with_mqa": "replicate", "kv_a_layernorm": "replicate", "kv_b_proj": "colwise",
                      "o_proj": "rowwise"}


def test_auto_tp_plan_splits_heads_and_replicates_the_latents() -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from megatron_bridge.distributed.tensor_parallel import ReplicateParallel, llama_tp_plan

    plan = llama_tp_plan(LlamaModel(_ours(16, num_layers=1), device="meta"), sequence_parallel=False)
    attn = "layers.0.self_attn"
    assert isinstance(plan[f"{attn}.q_b_proj"], ColwiseParallel)
    assert isinstance(plan[f"{attn}.kv_b_proj"], ColwiseParallel)
    assert isinstance(plan[f"{attn}.o_proj"], RowwiseParallel)
    for replicated in ("q_a_proj", "q_a_layernorm", "kv_a_proj_with_mqa", "kv_a_layernorm"):
        assert isinstance(plan[f"{attn}.{replicated}"], ReplicateParallel)
    assert not any(key.endswith(("k_proj", "v_proj")) for key in plan)


@pytest.mark.parametrize("q_lora_rank", [16, None])
def test_parameter_count_equals_the_built_model(q_lora_rank: int | None) -> None:
    from megatron_bridge.models.flops import num_parameters

    config = _ours(q_lora_rank, num_layers=2, vocab_size=64, num_moe_experts=4, moe_layer_freq=[0, 1],
                   moe_shared_expert_intermediate_size=16, moe_ffn_hidden_size=16)
    model = LlamaModel(config, device="meta")
    assert num_parameters(config) == sum(p.numel() for p in model.parameters())


def test_deepseek_v3_size_and_flops_per_token() -> None:
    """DeepSeek-V3 without its MTP module: 671B parameters, 37B active per token (its technical report); training
    FLOPs per token at 4096 tokens = 6 × (matmul weights a token uses + the attention over 4096 keys)."""
    from megatron_bridge.families.deepseek_v3.recipes import deepseek_v3_model
    from megatron_bridge.models.flops import num_floating_point_operations, num_parameters

    config = deepseek_v3_model()
    assert num_parameters(config) / 1e9 == pytest.approx(671, rel=0.01)
    active = num_parameters(config, active_only=True, include_embedding=False)
    assert (active + config.padded_vocab_size * config.hidden_size) / 1e9 == pytest.approx(37, rel=0.02)
    per_token = num_floating_point_operations(config, 1, 4096) / 4096
    attention = 61 * 2 * 128 * (192 + 128) * 4096
    assert per_token == pytest.approx(3 * (2 * (active - 61 * 2 * 7168 - 7168) + attention
                                           + 2 * config.padded_vocab_size * 7168), rel=1e-3)


def test_activation_estimate_counts_mla_widths_per_tp_rank() -> None:
    """The memory estimate's MLA block: input 128, latents 64 + 32 + 16, kv_b output 4 × (32 + 32), q and k
    4 × 48 each, v, output and output-projection input 4 × 32 each (compute-dtype bytes), latent norms 8 × (64 + 32);
    heads divide by TP, the latents do not."""
    from megatron_bridge.perf.activations import _mla_per_token
    from megatron_bridge.recipes import RECIPES

    m = RECIPES["tiny_deepseek_v3"].fn().model
    assert _mla_per_token(m, 2, 1) == (192, 192, 2 * (128 + 112 + 256 + 2 * 192 + 3 * 128), 8 * 96)
    assert _mla_per_token(m, 2, 2) == (96, 96, 2 * (128 + 112 + 128 + 2 * 96 + 3 * 64), 8 * 96)


def test_megatron_core_checkpoints_of_mla_are_refused_before_any_weight() -> None:
    from megatron_bridge.bridge.engine_checkpoints import megatron_core_checkpoint_config
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.errors import BridgeError

    with pytest.raises(BridgeError, match=r"model.multi_latent_attention=True: .*megatron_core_mla"):
        megatron_core_checkpoint_config(ConfigContainer(model=_ours(16)))


def test_custom_tp_plan_splits_mla_whole_or_not_at_all() -> None:
    from megatron_bridge.config.tp_plan import check_custom_plan
    from megatron_bridge.errors import ConfigValidationError

    config = _ours(None, num_layers=1, tensor_model_parallel_size=2)
    whole = {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.kv_b_proj": "colwise",
             "layers.*.self_attn.o_proj": "rowwise"}
    check_custom_plan(config, whole)
    check_custom_plan(config, {"layers.*.mlp.*": "colwise"})  # attention left whole
    with pytest.raises(ConfigValidationError, match="shards layers.0.self_attn partly"):
        check_custom_plan(config, {k: v for k, v in whole.items() if "kv_b" not in k})
    with pytest.raises(ConfigValidationError, match="latent projections"):
        check_custom_plan(config, {**whole, "layers.*.self_attn.kv_a_proj_with_mqa": "colwise"})
