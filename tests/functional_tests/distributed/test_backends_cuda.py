"""DDP and FSDP2 on CUDA/NCCL (auto backend): the same code path as on CPU/gloo, checked against a single-process
reference on the GPU (TF32 off, params atol 1e-5 after 3 SGD steps). Skipped without CUDA."""

import pytest
import torch

from megatron_bridge.config.distributed import FSDP2OffloadPolicy
from megatron_bridge.distributed.init import initialize_distributed
from tests.functional_tests.distributed.helpers import Case, run_cases, tiny_cfg
from tests.functional_tests.launcher import is_worker, launch


def _cuda_cfg(fsdp2: bool):  # noqa: ANN202
    def make():  # noqa: ANN202
        cfg = tiny_cfg(fsdp2=fsdp2)
        cfg.dist.distributed_backend = None  # auto: nccl with CUDA
        return cfg

    return make


def _meta(cfg) -> None:  # noqa: ANN001
    cfg.model.init_model_with_meta_device = True


def _pinned_offload(cfg) -> None:  # noqa: ANN001
    cfg.fsdp2.offload_policy = FSDP2OffloadPolicy(pin_memory=True)


@pytest.mark.gpu
def test_backends_on_cuda() -> None:
    if not is_worker():
        launch(f"{__file__}::test_backends_on_cuda", nproc=min(2, torch.cuda.device_count()))
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    env = initialize_distributed(_cuda_cfg(False)())
    assert env.backend == "nccl" and env.device == torch.device("cuda", env.local_rank)
    cases = [Case("default"), Case("meta-device build", _meta), Case("2 micro-batches", microbatches=2)]
    run_cases(cases, _cuda_cfg(False), device=env.device, atol=1e-5)
    fsdp2_cases = [*cases, Case("pinned CPU offload", _pinned_offload),
                   Case("selective AC", lambda cfg: setattr(cfg.fsdp2, "activation_checkpointing", "selective"))]
    run_cases(fsdp2_cases, _cuda_cfg(True), device=env.device, atol=1e-5)
