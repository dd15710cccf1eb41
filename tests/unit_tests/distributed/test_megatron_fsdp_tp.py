"""Tensor parallelism under Megatron FSDP, the parts that need no second rank: the mesh shape and its agreement with
the layout's groups, the expert mesh at EP 1 with TP, the TP-local parameters handed to megatron-fsdp (over a 1-rank
TP mesh, where the model must compute exactly what the plain one does), and the gradient-norm copy count. Training
at TP=2 is tests/functional_tests/moe/test_megatron_fsdp_moe.py and tests/functional_tests/training/
test_megatron_fsdp.py."""

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from megatron_bridge.distributed.megatron_fsdp_experts import expert_rank_layout
from megatron_bridge.distributed.megatron_fsdp_tp import fsdp_mesh_shape, grad_copies, local_tensor_parallel_params
from megatron_bridge.distributed.tensor_parallel import apply_tensor_parallel
from megatron_bridge.errors import MegatronBridgeError
from tests.unit_tests.distributed.helpers import batch, build, tiny_cfg


@pytest.mark.parametrize(("world", "tp", "cp"), [(2, 2, 1), (4, 2, 1), (8, 2, 2), (8, 4, 1), (4, 1, 2)])
def test_mesh_rows_and_columns_are_the_layouts_groups(world: int, tp: int, cp: int) -> None:
    """The ``(world / TP, TP)`` mesh over the ranks in order: each row is a data × context-parallel group of the
    layout ``("dp", "cp", "tp")`` (TP innermost) and each column a TP group."""
    shape = fsdp_mesh_shape(world, tp)
    assert shape == (world // tp, tp)
    ranks = torch.arange(world).reshape(shape)
    layout = torch.arange(world).reshape(world // (tp * cp), cp, tp)
    for t in range(tp):
        assert ranks[:, t].tolist() == layout[:, :, t].flatten().tolist()  # the "dp_cp" group of TP rank t
    for row in range(world // tp):
        assert ranks[row].tolist() == layout.reshape(-1, tp)[row].tolist()  # a TP group


def test_mesh_shape_needs_tp_to_divide_the_world() -> None:
    with pytest.raises(MegatronBridgeError, match="tensor_model_parallel_size=3 must divide the world size 4"):
        fsdp_mesh_shape(4, 3)


@pytest.mark.parametrize(("world", "tp"), [(2, 2), (4, 2), (8, 4)])
def test_expert_mesh_at_ep1_is_the_dense_mesh(world: int, tp: int) -> None:
    """At EP 1 the experts are TP-replicated parameters seeing the TP group's tokens: their ``"dp_cp"`` groups are the
    dense ones (not every rank), with TP as the ``"tp"`` dimension."""
    layout = expert_rank_layout(world, 1, tp)
    assert layout.shape == (1, world // tp, tp)
    assert layout[0].tolist() == torch.arange(world).reshape(fsdp_mesh_shape(world, tp)).tolist()


def test_expert_mesh_with_ep_folds_over_tp() -> None:
    """EP=4 over TP=2 × DP=2 (4 ranks): each EP rank alone in its expert-data-parallel group (edp 1); EP=2 over the
    same ranks: the EP groups are the TP groups, so edp pairs ranks 0/2 and 1/3."""
    assert expert_rank_layout(4, 4, 2).flatten().tolist() == [0, 1, 2, 3]
    assert expert_rank_layout(4, 2, 2)[:, :, 0].tolist() == [[0, 2], [1, 3]]


@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("tied", [False, True])
def test_local_parameters_compute_what_the_plain_model_does(sequence_parallel: bool, tied: bool) -> None:
    """After the TP plan every parameter is a plain tensor with megatron-core's TP attributes (split dimension of the
    plan's placement, or duplicated), the module classes keep their names, the state dict its keys, and the model's
    outputs and gradients equal the plain model's (tied embeddings: the output layer reads the embedding's view)."""
    cfg = tiny_cfg(sequence_parallel=sequence_parallel, share_embeddings_and_output_weights=tied)
    reference, model = build(cfg)[0], build(cfg)[0]
    apply_tensor_parallel(model, init_device_mesh("cpu", (1,), mesh_dim_names=("tp",)), cfg)
    placements = {n: p.placements[0] for n, p in model.named_parameters()}
    classes = [type(m).__name__ for m in model.modules()]
    assert local_tensor_parallel_params(model) == len(placements)
    assert [type(m).__name__ for m in model.modules()] == classes
    assert list(model.state_dict()) == list(reference.state_dict())
    for name, param in model.named_parameters():
        assert not isinstance(param, DTensor), name
        placement = placements[name]
        assert param.tensor_model_parallel == isinstance(placement, Shard), name
        assert param.partition_dim == (placement.dim if isinstance(placement, Shard) else -1), name
    q_proj = model.layers[0].self_attn.q_proj
    assert isinstance(q_proj.weight, DTensor) and q_proj.weight.placements == (Shard(0),)  # the forward's view
    assert isinstance(model.norm.weight, DTensor) and model.norm.weight.placements == (Replicate(),)
    ids = batch()
    expected, got = reference(ids, labels=ids), model(ids, labels=ids)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    expected.mean().backward()
    got.mean().backward()
    for (name, p), ref in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert not isinstance(p.grad, DTensor), name
        torch.testing.assert_close(p.grad, ref.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_grad_copies_counts_ranks_outside_and_replicated_on_the_mesh() -> None:
    """A plain gradient is on every rank; a DTensor on a 1-rank mesh is held by the ranks outside its mesh (a
    TP-replicated parameter sharded over "dp_cp" only), unless those hold other experts (EP)."""
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp_cp",))
    shard = DTensor.from_local(torch.ones(2), mesh, [Shard(0)], run_check=False)
    replicate = DTensor.from_local(torch.ones(2), mesh, [Replicate()], run_check=False)
    assert grad_copies(torch.ones(2), 4) == 4
    assert grad_copies(shard, 1) == grad_copies(replicate, 1) == 1
    assert grad_copies(shard, 2) == 2  # TP=2, world 2: the other TP rank holds the same shard
    assert grad_copies(shard, 4, ep_size=4) == 1  # EP=4: the other ranks hold other experts
