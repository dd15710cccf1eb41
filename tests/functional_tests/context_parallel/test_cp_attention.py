"""All-gather-KV context-parallel attention on 2 and 4 gloo ranks equals one-process causal attention.

Every rank builds the same full ``q, k, v`` (grouped-query: 4 query heads, 2 KV heads) and the one-process reference
(forward and backward) itself, then runs :func:`all_gather_attention` on its zig-zag slice. Output and the gradients
of its local q/k/v slices must equal the reference's rows at its positions within 1e-6 × max(1, max |reference|)
(fp32; dv entries reach ~3 here and differ by up to ~1.2e-6 absolute: the gradient of a key sums the contributions of
queries on other ranks in another order), with the plain causal mask and with a padding / end-of-document mask
(``segment_ids``: three documents, then padding).
"""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from megatron_bridge.distributed.context_parallel import zigzag_slice
from megatron_bridge.distributed.cp_attention import ContextParallelAttention, all_gather_attention, causal_attention
from tests.functional_tests.launcher import is_worker, launch


pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

ATOL = 1e-6
BATCH, HEADS, KV_HEADS, SEQ, DIM = 2, 4, 2, 48, 8


def _segments() -> torch.Tensor:
    """Row 0: documents of 10, 20 and 9 tokens, then 9 padding tokens (segment -1); row 1: one document."""
    row0 = torch.tensor([0] * 10 + [1] * 20 + [2] * 9 + [-1] * 9)
    return torch.stack([row0, torch.zeros(SEQ, dtype=torch.long)])


def _check(segment_ids: torch.Tensor | None) -> float:
    world, rank = dist.get_world_size(), dist.get_rank()
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(BATCH, HEADS, SEQ, DIM, generator=gen, requires_grad=True)
    k = torch.randn(BATCH, KV_HEADS, SEQ, DIM, generator=gen, requires_grad=True)
    v = torch.randn(BATCH, KV_HEADS, SEQ, DIM, generator=gen, requires_grad=True)
    grad_out = torch.randn(BATCH, HEADS, SEQ, DIM, generator=gen)
    ref = causal_attention(q, k, v, segment_ids)
    ref.backward(grad_out)

    local = [zigzag_slice(t.detach(), world, rank, dim=2).requires_grad_() for t in (q, k, v)]
    seg = zigzag_slice(segment_ids, world, rank, dim=1) if segment_ids is not None else None
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
    out = ContextParallelAttention(mesh, "all_gather")(*local, seg)
    out.backward(zigzag_slice(grad_out, world, rank, dim=2))
    failures, worst = [], 0.0
    pairs = [("out", out, ref.detach())] + [(f"d{n}", p.grad, f.grad) for n, f, p in zip("qkv", (q, k, v), local)]
    for name, got, full in pairs:
        want = zigzag_slice(full, world, rank, dim=2)
        diff = (got - want).abs().max().item()
        worst = max(worst, diff / max(1.0, want.abs().max().item()))
        if diff > ATOL * max(1.0, want.abs().max().item()):
            failures.append(f"{name} differs by {diff:.3g} (max |ref| {want.abs().max().item():.3g})")
    # every rank asserts after all its collectives: a failure must not leave a peer waiting in one
    assert not failures, f"rank {rank} (CP={world}): " + "; ".join(failures)
    return worst


def _run() -> None:
    dist.init_process_group("gloo")
    plain = _check(None)
    masked = _check(_segments())
    # the functional form, without the mesh wrapper, gives the same output
    world, rank = dist.get_world_size(), dist.get_rank()
    x = torch.randn(1, 2, SEQ // world, 4, generator=torch.Generator().manual_seed(rank))
    group = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",)).get_group()
    assert all_gather_attention(x, x, x, group, rank).shape == x.shape
    print(f"[cp attention] CP={world} rank {rank}: max diff plain {plain:.2e}, masked {masked:.2e}")


def test_cp2_attention_matches_one_process() -> None:
    if not is_worker():
        launch(f"{__file__}::test_cp2_attention_matches_one_process", nproc=2)
        return
    _run()


def test_cp4_attention_matches_one_process() -> None:
    if not is_worker():
        launch(f"{__file__}::test_cp4_attention_matches_one_process", nproc=4)
        return
    _run()
