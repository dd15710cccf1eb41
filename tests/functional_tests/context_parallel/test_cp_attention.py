"""All-gather-KV context-parallel attention over 2 and 4 gloo ranks equals one-process causal attention.

Both tests share one 4-rank torchrun launch (launcher.py's ``LaunchGroups``; each stays a test of its own): CP=4 over
all ranks, and CP=2 over each half of a (dp=2, cp=2) device mesh, as training carves CP groups out of a larger job
(the CP rank is then not the global rank).

Every rank builds the same full ``q, k, v`` (grouped-query: 4 query heads, 2 KV heads) and the one-process reference
(forward and backward) itself, then runs :func:`all_gather_attention` on its zig-zag slice. Output and the gradients
of its local q/k/v slices must equal the reference's rows at its positions within 1e-6 × max(1, max |reference|)
(fp32; dv entries reach ~3 here and differ by up to ~1.2e-6 absolute: the gradient of a key sums the contributions of
queries on other ranks in another order), with the plain causal mask and with a padding / end-of-document mask
(``segment_ids``: three documents, then padding), and with a sliding window of 11 tokens (shorter than the sequence,
longer than a zig-zag chunk) against the one-process window attention of ``megatron_bridge.models.attention``, and
with attention sinks (4 per-head logits, with and without the window; the sinks' gradients summed over the CP ranks
equal the one-process gradient).
"""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from megatron_bridge.data.zigzag import zigzag_slice
from megatron_bridge.distributed.cp_attention import ContextParallelAttention, all_gather_attention, causal_attention
from megatron_bridge.models import attention
from tests.functional_tests.launcher import LaunchGroups, is_worker, selected_groups


pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

ATOL = 1e-6
BATCH, HEADS, KV_HEADS, SEQ, DIM = 2, 4, 2, 48, 8
GROUPS = {4: ["test_cp2_attention_matches_one_process", "test_cp4_attention_matches_one_process"]}
"""One launch of 4 ranks runs both tests."""


@pytest.fixture(scope="module")
def launches(request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The module's launch (launching process only), running the tests this session selected."""
    return None if is_worker() else LaunchGroups(__file__, selected_groups(request, GROUPS), {4: 300})


def _segments() -> torch.Tensor:
    """Row 0: documents of 10, 20 and 9 tokens, then 9 padding tokens (segment -1); row 1: one document."""
    row0 = torch.tensor([0] * 10 + [1] * 20 + [2] * 9 + [-1] * 9)
    return torch.stack([row0, torch.zeros(SEQ, dtype=torch.long)])


def _cp_mesh(cp: int):  # noqa: ANN202  (DeviceMesh)
    """The 1-D ``"cp"`` mesh of this rank: ``cp`` consecutive ranks of a (dp, cp) mesh over the whole launch."""
    world = dist.get_world_size()
    return init_device_mesh("cpu", (world // cp, cp), mesh_dim_names=("dp", "cp"))["cp"]


WINDOW = 11


def _check(segment_ids: torch.Tensor | None, mesh, window: int | None = None,  # noqa: ANN001
           with_sinks: bool = False) -> float:
    world, rank = mesh.size(), mesh.get_local_rank()
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(BATCH, HEADS, SEQ, DIM, generator=gen, requires_grad=True)
    k = torch.randn(BATCH, KV_HEADS, SEQ, DIM, generator=gen, requires_grad=True)
    v = torch.randn(BATCH, KV_HEADS, SEQ, DIM, generator=gen, requires_grad=True)
    grad_out = torch.randn(BATCH, HEADS, SEQ, DIM, generator=gen)
    sinks = (2.0 * torch.randn(HEADS, generator=gen)).requires_grad_() if with_sinks else None
    if window is None and sinks is None:
        ref = causal_attention(q, k, v, segment_ids)
    else:
        ref = attention.causal_attention(q, k, v, window, sinks=sinks)
    ref.backward(grad_out)

    local = [zigzag_slice(t.detach(), world, rank, dim=2).requires_grad_() for t in (q, k, v)]
    seg = zigzag_slice(segment_ids, world, rank, dim=1) if segment_ids is not None else None
    local_sinks = sinks.detach().clone().requires_grad_() if sinks is not None else None
    out = ContextParallelAttention(mesh, "all_gather")(*local, seg, window=window, sinks=local_sinks)
    out.backward(zigzag_slice(grad_out, world, rank, dim=2))
    failures, worst = [], 0.0
    pairs = [("out", out, ref.detach())] + [(f"d{n}", p.grad, f.grad) for n, f, p in zip("qkv", (q, k, v), local)]
    if sinks is not None:  # each rank holds its queries' part of the sinks' gradient: their sum is the reference's
        dist.all_reduce(local_sinks.grad, group=mesh.get_group())
        diff = (local_sinks.grad - sinks.grad).abs().max().item()
        if diff > ATOL * max(1.0, sinks.grad.abs().max().item()):
            failures.append(f"dsinks differs by {diff:.3g}")
    for name, got, full in pairs:
        want = zigzag_slice(full, world, rank, dim=2)
        diff = (got - want).abs().max().item()
        worst = max(worst, diff / max(1.0, want.abs().max().item()))
        if diff > ATOL * max(1.0, want.abs().max().item()):
            failures.append(f"{name} differs by {diff:.3g} (max |ref| {want.abs().max().item():.3g})")
    # every rank asserts after all its collectives: a failure must not leave a peer waiting in one
    assert not failures, f"rank {rank} (CP={world}): " + "; ".join(failures)
    return worst


def _run(cp: int) -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo")  # one group for the launch's tests
    mesh = _cp_mesh(cp)
    plain = _check(None, mesh)
    masked = _check(_segments(), mesh)
    windowed = _check(None, mesh, WINDOW)
    sinks = max(_check(None, mesh, with_sinks=True), _check(None, mesh, WINDOW, with_sinks=True))
    # the functional form, without the mesh wrapper, gives the same output
    rank = mesh.get_local_rank()
    x = torch.randn(1, 2, SEQ // cp, 4, generator=torch.Generator().manual_seed(rank))
    assert all_gather_attention(x, x, x, mesh.get_group(), rank).shape == x.shape
    print(f"[cp attention] CP={cp} rank {dist.get_rank()} (CP rank {rank}): max diff plain {plain:.2e}, "
          f"masked {masked:.2e}, window {windowed:.2e}, sinks {sinks:.2e}")


def test_cp2_attention_matches_one_process(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_cp2_attention_matches_one_process")  # type: ignore[union-attr]
        return
    _run(2)


def test_cp4_attention_matches_one_process(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_cp4_attention_matches_one_process")  # type: ignore[union-attr]
        return
    _run(4)
