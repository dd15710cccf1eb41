"""Group-limited routing (``model.moe_router_num_groups``/``moe_router_group_topk``, ``models/moe.py``) picks the same
experts with the same weights as transformers' ``DeepseekV3TopkRouter`` on random inputs, with a random expert bias;
without groups (or keeping every group) the routing is the plain sigmoid top-k."""

import pytest
import torch

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.models.moe import limit_to_groups, route


def _config(experts: int, k: int, groups: int | None, keep: int | None) -> ModelConfig:
    return ModelConfig(num_moe_experts=experts, moe_router_topk=k, moe_router_score_function="sigmoid",
                       moe_router_enable_expert_bias=True, moe_router_topk_scaling_factor=2.5,
                       moe_router_num_groups=groups, moe_router_group_topk=keep)


@pytest.mark.parametrize(("experts", "k", "groups", "keep"), [(16, 4, 4, 2), (8, 2, 2, 1), (12, 3, 3, 2),
                                                               (8, 6, 1, 1)])
def test_group_routing_picks_transformers_experts(experts: int, k: int, groups: int, keep: int) -> None:
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    torch.manual_seed(0)
    hf_cfg = DeepseekV3Config(hidden_size=16, n_routed_experts=experts, num_experts_per_tok=k, n_group=groups,
                              topk_group=keep, norm_topk_prob=True, routed_scaling_factor=2.5)
    router = DeepseekV3TopkRouter(hf_cfg)
    with torch.no_grad():
        router.weight.normal_(0.0, 1.0)
        router.e_score_correction_bias.normal_(0.0, 0.3)
    x = torch.randn(256, 16)
    logits, hf_weights, hf_idx = router(x)
    probs, idx, _ = route(logits, _config(experts, k, groups, keep), router.e_score_correction_bias)
    hf_sorted, order = hf_idx.sort(dim=-1)
    ours_sorted, ours_order = idx.sort(dim=-1)
    assert torch.equal(ours_sorted, hf_sorted)
    assert (probs.gather(-1, ours_order) - hf_weights.gather(-1, order)).abs().max() <= 1e-6


def test_groups_mask_the_unchosen_groups_by_hand() -> None:
    select = torch.tensor([[0.9, 0.1, 0.5, 0.45, 0.2, 0.2, 0.8, 0.0]])  # group sums of top-2: 1.0, 0.95, 0.4, 0.8
    masked = limit_to_groups(select, _config(8, 2, 4, 2))
    assert torch.equal(torch.isinf(masked)[0], torch.tensor([False, False, False, False, True, True, True, True]))
    assert limit_to_groups(select, _config(8, 2, None, None)) is select
    assert limit_to_groups(select, _config(8, 2, 4, 4)) is select


@pytest.mark.parametrize(("method", "groups", "keep", "norm"), [("greedy", None, None, False),
                                                                 ("group_limited_greedy", 4, 2, False),
                                                                 ("greedy", None, None, True),
                                                                 ("group_limited_greedy", 4, 1, True)])
def test_softmax_routing_picks_deepseek_v2_experts(method: str, groups: int | None, keep: int | None,
                                                   norm: bool) -> None:
    """DeepSeek-V2's router (softmax over every expert, greedy or group-limited top-k, a group scored by its best
    expert, no expert bias, times routed_scaling_factor) as the DeepSeek-V2 mapping sets it: softmax with
    moe_router_pre_softmax (norm_topk_prob false: the k probabilities as they are), or without (true: normalized,
    which transformers' V2 router does not do, so the reference is normalized here)."""
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    torch.manual_seed(0)
    hf_cfg = DeepseekV2Config(hidden_size=16, num_attention_heads=4, n_routed_experts=16, num_experts_per_tok=3,
                              n_group=groups, topk_group=keep, topk_method=method, routed_scaling_factor=1.5)
    router = DeepseekV2TopkRouter(hf_cfg)
    with torch.no_grad():
        router.weight.normal_(0.0, 1.0)
    logits, hf_weights, hf_idx = router(torch.randn(256, 16))
    if norm:
        hf_weights = hf_weights / hf_weights.sum(dim=-1, keepdim=True) * 1.5
    config = ModelConfig(num_moe_experts=16, moe_router_topk=3, moe_router_score_function="softmax",
                         moe_router_pre_softmax=not norm, moe_router_topk_scaling_factor=1.5,
                         moe_router_num_groups=groups, moe_router_group_topk=keep)
    probs, idx, _ = route(logits, config, None)
    hf_sorted, order = hf_idx.sort(dim=-1)
    ours_sorted, ours_order = idx.sort(dim=-1)
    assert torch.equal(ours_sorted, hf_sorted)
    assert (probs.gather(-1, ours_order) - hf_weights.gather(-1, order)).abs().max() <= 1e-6
