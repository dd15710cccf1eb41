"""GPU only: model.cp_comm_type="p2p" (PyTorch's ring attention) gives the numbers of "all_gather" within bf16
tolerance, forward and backward, on 2 CUDA ranks (NCCL). Skipped without 2 CUDA devices (torch's context_parallel
has no CPU kernels; the CPU side of the boundary is tested in tests/unit_tests/distributed/test_context_parallel.py).
"""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from megatron_bridge.data.zigzag import zigzag_slice
from megatron_bridge.distributed.cp_attention import ContextParallelAttention
from tests.functional_tests.launcher import is_worker, launch


pytestmark = [
    pytest.mark.distributed,
    pytest.mark.timeout(300),
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="ring attention (cp_comm_type='p2p') needs 2 CUDA GPUs"),
]

BF16_ATOL = 2e-2


def test_ring_attention_matches_all_gather_bf16() -> None:
    if not is_worker():
        launch(f"{__file__}::test_ring_attention_matches_all_gather_bf16", nproc=2)
        return
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("cp",))
    gen = torch.Generator(device="cuda").manual_seed(3)
    shapes = [(2, 8, 256, 64), (2, 2, 256, 64), (2, 2, 256, 64)]  # GQA: 8 query heads, 2 KV heads
    full = [torch.randn(s, generator=gen, device="cuda", dtype=torch.bfloat16) for s in shapes]
    grad_out = zigzag_slice(torch.randn(shapes[0], generator=gen, device="cuda", dtype=torch.bfloat16), world, rank, 2)
    results = {}
    for comm in ("all_gather", "p2p"):
        local = [zigzag_slice(t, world, rank, dim=2).clone().requires_grad_() for t in full]
        out = ContextParallelAttention(mesh, comm)(*local)
        out.backward(grad_out)
        results[comm] = [out.detach().float()] + [t.grad.float() for t in local]
    for name, a, b in zip(("out", "dq", "dk", "dv"), results["all_gather"], results["p2p"]):
        diff = (a - b).abs().max().item()
        assert diff <= BF16_ATOL * max(1.0, a.abs().max().item()), f"{name}: ring vs all-gather differ by {diff}"
