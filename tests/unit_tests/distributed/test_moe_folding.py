"""MoE parallel folding without processes: which global ranks form each EP / expert-data / expert-TP group
(megatron-core's ``(edp, ep, etp)`` re-split of a stage's ``dp × cp × tp`` ranks), the rules
``expert_parallel_layout`` and ``expert_tensor_parallel``, the TP plan of a folded MoE layer and the sequence
slicing of the token split. The distributed behaviour (all-to-all, gathers, gradients) is tested on gloo ranks in
tests/functional_tests/moe/test_expert_parallel.py."""

import pytest
import torch
from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleInputOutput, RowwiseParallel

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.config.rules_moe import expert_tensor_parallel_size, splits_tokens_over_tp
from megatron_bridge.distributed.expert_parallel import etp_dim, expert_rank_grid
from megatron_bridge.distributed.expert_tokens import seq_slice
from megatron_bridge.distributed.tensor_parallel import moe_tp_plan
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.models.llama import _linear
from megatron_bridge.models.moe import MoELayer
from megatron_bridge.recipes import tiny_moe_pretrain_config


def groups(grid: torch.Tensor, dim: int) -> list[list[int]]:
    """The rank groups along mesh dimension ``dim`` of a ``(pp, edp, ep, etp)`` grid."""
    return sorted(grid.movedim(dim, -1).reshape(-1, grid.shape[dim]).tolist())


EP_DIM, EDP_DIM = 2, 1


def test_ep_spans_the_tp_group_of_qwen3_30b_at_8() -> None:
    """TP4 PP2 EP4 (dp 1): each stage's EP group is its TP group; no expert-data replicas."""
    grid = expert_rank_grid(8, pp=2, ep=4)
    assert grid.shape == (2, 1, 4, 1)
    assert groups(grid, EP_DIM) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert groups(grid, EDP_DIM) == [[r] for r in range(8)]


def test_ep_over_tp_then_data_ranks() -> None:
    """TP2 DP4 EP2: the EP groups are the TP pairs, the expert-data groups the data-parallel ranks of one TP index;
    TP2 DP2 EP4: one EP group over all 4 ranks."""
    grid = expert_rank_grid(8, pp=1, ep=2)
    assert groups(grid, EP_DIM) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups(grid, EDP_DIM) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert groups(expert_rank_grid(4, pp=1, ep=4), EP_DIM) == [[0, 1, 2, 3]]


def test_ep_over_tp_and_cp_with_pipeline() -> None:
    """PP2 DP2 CP2 TP2 (16 ranks, stage = 8 consecutive ranks in (dp, cp, tp) order), EP4: an EP group is one data
    rank's CP × TP ranks; the expert-data groups pair the two data ranks."""
    grid = expert_rank_grid(16, pp=2, ep=4)
    assert groups(grid, EP_DIM) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert groups(grid, EDP_DIM) == [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14], [11, 15]]
    assert groups(grid, 0) == [[r, r + 8] for r in range(8)]  # the pipeline groups of the main mesh


def test_tp1_keeps_ep_carved_out_of_dp_cp() -> None:
    """Without TP the grid is the former layout: consecutive (dp, cp) ranks form an EP group."""
    grid = expert_rank_grid(4, pp=1, ep=2)
    assert groups(grid, EP_DIM) == [[0, 1], [2, 3]] and groups(grid, EDP_DIM) == [[0, 2], [1, 3]]


def _cfg(**layout: object) -> ConfigContainer:
    cfg = tiny_moe_pretrain_config(**{"seq_length": 64, "use_torch_fsdp2": True, **layout})
    cfg.model.num_layers, cfg.model.expert_tensor_parallel_size = 4, 1
    return cfg


def test_qwen3_30b_layout_validates_at_8() -> None:
    """Megatron-Bridge's 8-GPU Qwen3-30B-A3B layout (TP4 PP2 EP4 ETP1, dp 1) on the tiny MoE: EP spans the TP
    ranks, so it validates at 8 ranks, and the TP group's tokens are split."""
    cfg = _cfg(tensor_model_parallel_size=4, pipeline_model_parallel_size=2, expert_model_parallel_size=4,
               sequence_parallel=True, global_batch_size=8, micro_batch_size=1)
    cfg.model.num_attention_heads = cfg.model.num_query_groups = 4
    cfg.validate(world_size=8)
    assert splits_tokens_over_tp(cfg)


@pytest.mark.parametrize(("layout", "world", "paths"), [
    ({"tensor_model_parallel_size": 2, "expert_model_parallel_size": 8}, 4,
     {"model.expert_model_parallel_size", "model.tensor_model_parallel_size"}),  # EP 8 > dp × cp × tp = 4
    ({"tensor_model_parallel_size": 4, "expert_model_parallel_size": 2, "sequence_parallel": False,
      "seq_length": 66}, 4, {"model.seq_length"}),  # each TP rank routes 66 / 4 tokens of a sequence
])
def test_expert_parallel_layout_refusals(layout: dict, world: int, paths: set[str]) -> None:
    with pytest.raises(ConfigValidationError, match=r"\[rule expert_parallel_layout\]") as info:
        _cfg(**layout).validate(world_size=world)
    assert paths <= set(info.value.paths)


def test_expert_tensor_parallel_values() -> None:
    """ETP 1 and ETP = TP (None means TP) are built; other values, and an expert width TP does not divide, are
    refused."""
    cfg = ConfigContainer(model=ModelConfig(num_moe_experts=4, tensor_model_parallel_size=2))
    assert expert_tensor_parallel_size(cfg) == 2
    for etp in (None, 1, 2):
        cfg = _cfg(tensor_model_parallel_size=2, expert_model_parallel_size=2)
        cfg.model.expert_tensor_parallel_size = etp
        cfg.validate(world_size=4)
        assert splits_tokens_over_tp(cfg) == (etp == 1)
    cfg = _cfg(tensor_model_parallel_size=2, expert_model_parallel_size=2)
    cfg.model.expert_tensor_parallel_size = 2
    with pytest.raises(ConfigValidationError, match=r"\[rule expert_parallel_layout\]"):
        cfg.validate(world_size=2)  # EP 2 × ETP 2 > dp × tp = 2
    for etp, ffn, message in ((3, 96, "must be 1 or"), (2, 95, "not divisible")):
        cfg = _cfg(tensor_model_parallel_size=2, expert_model_parallel_size=2)
        cfg.model.expert_tensor_parallel_size, cfg.model.moe_ffn_hidden_size = etp, ffn
        with pytest.raises(ConfigValidationError, match=r"\[rule expert_tensor_parallel\]") as info:
            cfg.validate(world_size=4)
        assert message in str(info.value) and "model.expert_tensor_parallel_size" in info.value.paths


def test_etp_grid_and_split_dims() -> None:
    """ETP = TP 2 on TP2 DP2 with EP2: the ETP groups are the TP pairs, EP runs over the data-parallel ranks of one
    TP index; gate/up split on F (their last dimension), down on F (its middle one)."""
    grid = expert_rank_grid(4, pp=1, ep=2, etp=2)
    assert groups(grid, 3) == [[0, 1], [2, 3]] and groups(grid, EP_DIM) == [[0, 2], [1, 3]]
    assert etp_dim("layers.1.mlp.experts.gate_proj") == etp_dim("up_proj") == 2
    assert etp_dim("state.layers.1.mlp.experts.down_proj") == 1


def test_tokens_split_only_with_ep_and_tp() -> None:
    assert not splits_tokens_over_tp(_cfg(tensor_model_parallel_size=2, expert_model_parallel_size=1))
    assert not splits_tokens_over_tp(_cfg(tensor_model_parallel_size=1, expert_model_parallel_size=2))
    assert splits_tokens_over_tp(_cfg(tensor_model_parallel_size=2, expert_model_parallel_size=2))


class _Split:
    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def gather(self, y: torch.Tensor) -> torch.Tensor:
        return y


@pytest.mark.parametrize("split", [False, True])
def test_moe_tp_plan_with_and_without_token_split(split: bool) -> None:
    """EP = 1: the layer gathers the sequence on entry. Folded: the layer keeps the rank's shard (as a local tensor)
    and only the shared expert gathers it, reduce-scattering its output."""
    config = ModelConfig(num_layers=1, hidden_size=16, ffn_hidden_size=32, num_attention_heads=2, num_moe_experts=4,
                         moe_ffn_hidden_size=8, moe_shared_expert_intermediate_size=8)
    layer = MoELayer(config, dtype=torch.float32, linear=_linear)
    layer.tp_tokens = _Split() if split else None
    plan = moe_tp_plan("mlp", layer, sequence_parallel=True)
    if split:
        assert type(plan["mlp"]) is PrepareModuleInput and type(plan["mlp.shared_experts"]) is PrepareModuleInput
    else:
        assert type(plan["mlp"]) is PrepareModuleInputOutput and "mlp.shared_experts" not in plan
    down = plan["mlp.shared_experts.down_proj"]
    assert isinstance(down, RowwiseParallel)
    assert str(down.output_layouts[0]) == ("S(1)" if split else "R")


def test_seq_slice_parts_join_to_the_sequence() -> None:
    x = torch.arange(2 * 8 * 3).reshape(2, 8, 3)
    parts = [seq_slice(x, 4, r) for r in range(4)]
    assert all(p.shape == (2, 2, 3) and p.is_contiguous() for p in parts)
    assert torch.equal(torch.cat(parts, dim=1), x)
    assert torch.equal(parts[1], x[:, 2:4])
