"""DDP on 2 gloo ranks: every option trains exactly like a single process on the global batch (fp32, atol 1e-6)."""

import pytest
import torch
import torch.distributed as dist

from megatron_bridge.distributed.ddp import DDPBackend
from megatron_bridge.distributed.init import build_device_mesh, initialize_distributed
from megatron_bridge.engines.ddp_wrap import ddp_wrap
from megatron_bridge.errors import TrainingError
from tests.functional_tests.distributed.helpers import Case, global_batches, run_cases, tiny_cfg
from tests.functional_tests.launcher import TWO_RANKS, is_worker, join_launch_group


def _set(**options: object):  # noqa: ANN202
    def configure(cfg) -> None:  # noqa: ANN001
        for path, value in options.items():
            section, name = path.split("__")
            setattr(getattr(cfg, section), name, value)

    return configure


CASES = [
    Case("default"),
    Case("small buckets + gradient_as_bucket_view", _set(ddp__bucket_cap_mb=0.01, ddp__gradient_as_bucket_view=True)),
    Case("static_graph", _set(ddp__static_graph=True)),
    Case("find_unused_parameters + broadcast_buffers", _set(ddp__find_unused_parameters=True,
                                                            ddp__broadcast_buffers=True)),
    Case("full activation checkpointing", _set(ddp__activation_checkpointing=True)),
    Case("selective activation checkpointing", _set(ddp__activation_checkpointing="selective")),
    Case("recompute_granularity=full, block, 1 layer", _set(model__recompute_granularity="full",
                                                           model__recompute_method="block",
                                                           model__recompute_num_layers=1)),
    Case("no_sync gradient accumulation (2 micro-batches)", microbatches=2),
    Case("meta-device build", _set(model__init_model_with_meta_device=True)),
    Case("frozen embedding", freeze_embedding=True),
]


def test_ddp_two_ranks(request: pytest.FixtureRequest) -> None:
    if not is_worker():
        TWO_RANKS.check(request)
        return
    join_launch_group()  # initialize_distributed reuses it
    env = initialize_distributed(tiny_cfg())
    assert (env.world_size, env.backend, env.device.type) == (2, "gloo", "cpu")
    mesh = build_device_mesh(tiny_cfg(), env)
    assert mesh.mesh_dim_names == ("dp",) and mesh.size() == 2

    run_cases(CASES, tiny_cfg)
    _check_nan_gradient_norm_raises_on_every_rank()


def _check_nan_gradient_norm_raises_on_every_rank() -> None:
    cfg = tiny_cfg()
    cfg.ddp.check_for_nan_in_grad = True
    torch.manual_seed(0)
    from megatron_bridge.models import build_model_chunks

    backend = ddp_wrap(build_model_chunks(cfg.model, device="cpu"), cfg, torch.device("cpu"))
    assert isinstance(backend, DDPBackend)
    ids = global_batches()[0].chunk(2)[dist.get_rank()]
    if dist.get_rank() == 1:
        ids = ids.clone()
    loss = backend.chunks[0](ids, labels=ids).mean()
    if dist.get_rank() == 1:
        loss = loss * float("nan")  # only rank 1 produces NaN; the all-reduce spreads it to rank 0
    loss.backward()
    with pytest.raises(TrainingError, match="ddp.check_for_nan_in_grad"):
        backend.clip_grad_norm(1.0)
