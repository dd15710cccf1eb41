"""MoE on Megatron FSDP, the parts that need no process group: the expert mesh's rank layout, what megatron-fsdp
0.6.1 reads to find expert parameters, and the single-rank gradient-scaling workaround's bucket selection. The
training itself (parity with one process, checkpoints) is tests/functional_tests/moe/test_megatron_fsdp_moe.py."""

import inspect
from types import SimpleNamespace

import megatron_fsdp
import megatron_fsdp.param_and_grad_buffer as pgb
import pytest
import torch
from torch import nn

from megatron_bridge.distributed.expert_parallel import expert_rank_grid
from megatron_bridge.distributed.megatron_fsdp_compat import MESH_DIM_NAMES, defer_single_rank_grad_scaling
from megatron_bridge.distributed.megatron_fsdp_experts import EXPERT_MESH_DIMS, expert_rank_layout


@pytest.mark.parametrize(("world", "ep"), [(2, 2), (2, 1), (4, 2), (8, 4)])
def test_expert_mesh_rows_are_the_expert_data_parallel_groups(world: int, ep: int) -> None:
    """Row ``e`` of the layout (megatron-fsdp's ``"dp_cp"`` group) holds the ranks of EP index ``e``: the same "edp"
    groups as the expert-parallel layer's mesh."""
    layout = expert_rank_layout(world, ep)
    grid = expert_rank_grid(world, 1, ep, 1)[0]  # (edp, ep, 1)
    assert layout.shape == (ep, world // ep, 1)
    for e in range(ep):
        assert layout[e, :, 0].tolist() == grid[:, e, 0].tolist() == list(range(e, world, ep))
    assert EXPERT_MESH_DIMS[1:] == MESH_DIM_NAMES


def test_megatron_fsdp_takes_an_expert_mesh_and_finds_experts_by_name() -> None:
    """The installed megatron-fsdp accepts ``expt_device_mesh`` and classifies parameters named ``*.experts.*`` as
    expert parameters; the native MoE layer's routed experts (weights and biases) are named so, its shared expert and
    router are not."""
    from megatron_bridge.models.provider import build_model_chunks
    from megatron_bridge.recipes import tiny_moe_pretrain_config

    assert "expt_device_mesh" in inspect.signature(megatron_fsdp.fully_shard_model).parameters
    assert '".experts." in n' in inspect.getsource(pgb)
    cfg = tiny_moe_pretrain_config()
    cfg.model.moe_shared_expert_intermediate_size = 64
    cfg.model.init_model_with_meta_device = True
    names = [n for n, _ in build_model_chunks(cfg.model)[0].named_parameters()]
    experts = [n for n in names if ".experts." in n]
    assert experts and all(".mlp.experts." in n for n in experts)
    assert any("shared_expert" in n for n in names) and any("router" in n for n in names)
    assert not any(".experts." in n for n in names if "shared_expert" in n or "router" in n)


def _bucket(distributed: bool, factor: float | None, *params: nn.Parameter) -> SimpleNamespace:
    gbuf = SimpleNamespace(is_data_distributed=distributed, gradient_scaling_factor=factor)
    return SimpleNamespace(main_grad_buffer=gbuf, params=list(params))


def test_single_rank_buckets_defer_their_scaling() -> None:
    """Under sharded gradients a bucket whose gradient buffer is not distributed (a one-rank group) loses its
    scaling factor and is returned with the optimizer parameters it covers; distributed buckets, unscaled ones and the
    strategies that reduce once per step are left alone."""
    raw = [nn.Parameter(torch.zeros(2)) for _ in range(4)]
    names = {p: f"p{i}" for i, p in enumerate(raw)}
    optimized = [(f"p{i}", nn.Parameter(torch.zeros(2))) for i in range(4)]
    groups = [_bucket(True, 0.5, raw[0]), _bucket(False, 0.5, raw[1], raw[2]), _bucket(False, None, raw[3])]
    buffer = SimpleNamespace(parameter_groups=groups, param_to_name=names, optimizer_named_parameters=optimized)
    wrapped = SimpleNamespace(data_parallel_sharding_strategy="optim_grads_params", param_and_grad_buffer=buffer)
    deferred = defer_single_rank_grad_scaling(wrapped)
    assert deferred == [([optimized[1][1], optimized[2][1]], 0.5)]
    assert groups[1].main_grad_buffer.gradient_scaling_factor is None
    assert groups[0].main_grad_buffer.gradient_scaling_factor == 0.5
    groups[1].main_grad_buffer.gradient_scaling_factor = 0.5
    for strategy in ("no_shard", "optim"):
        wrapped.data_parallel_sharding_strategy = strategy
        assert defer_single_rank_grad_scaling(wrapped) == []
        assert groups[1].main_grad_buffer.gradient_scaling_factor == 0.5
