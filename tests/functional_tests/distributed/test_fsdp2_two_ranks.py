"""FSDP2 on 2 gloo ranks: every sharding option trains exactly like a single process on the global batch (fp32,
params atol 1e-6 after 3 SGD steps, grad norms rtol 1e-5), and a meta-device build materializes shard by shard into
exactly the parameters of a direct build."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from megatron_bridge.config.distributed import FSDP2OffloadPolicy
from megatron_bridge.distributed.init import initialize_distributed
from megatron_bridge.engines.ddp_wrap import ddp_wrap
from megatron_bridge.models import build_model_chunks
from tests.functional_tests.distributed.helpers import Case, run_cases, tiny_cfg
from tests.functional_tests.launcher import TWO_RANKS, is_worker, join_launch_group


def _fsdp2(**options: object):  # noqa: ANN202
    def configure(cfg) -> None:  # noqa: ANN001
        for name, value in options.items():
            setattr(cfg.fsdp2, name, value)

    return configure


def _meta(cfg) -> None:  # noqa: ANN001
    cfg.model.init_model_with_meta_device = True


OFFLOAD = FSDP2OffloadPolicy(pin_memory=False)

CASES = [
    Case("reshard None (heuristic), prefetch fwd 1 / bwd 2"),
    Case("reshard True, prefetch fwd 2 / bwd 1", _fsdp2(reshard_after_forward=True, fsdp2_forward_prefetch_depth=2,
                                                        fsdp2_backward_prefetch_depth=1)),
    Case("reshard False (no prefetch chains)", _fsdp2(reshard_after_forward=False)),
    Case("reshard None, prefetch off", _fsdp2(enable_fsdp2_prefetch=False)),
    Case("CPU offload", _fsdp2(offload_policy=OFFLOAD)),
    Case("defer_fsdp_grad_sync, 2 micro-batches", _fsdp2(defer_fsdp_grad_sync=True), microbatches=2),
    Case("sync every micro-batch, 2 micro-batches", _fsdp2(defer_fsdp_grad_sync=False), microbatches=2),
    Case("full activation checkpointing", _fsdp2(activation_checkpointing="full")),
    Case("selective activation checkpointing", _fsdp2(activation_checkpointing="selective")),
    Case("MLP-only activation checkpointing", _fsdp2(mlp_activation_checkpointing=True)),
    Case("frozen embedding, policy root", _fsdp2(frozen_module_policy="root"), freeze_embedding=True),
    Case("frozen embedding, policy per_layer", _fsdp2(frozen_module_policy="per_layer"), freeze_embedding=True),
    Case("frozen embedding, policy replicate", _fsdp2(frozen_module_policy="replicate"), freeze_embedding=True),
    Case("meta-device build", _meta),
    Case("meta-device build + CPU offload + reshard True",
         lambda cfg: (_meta(cfg), _fsdp2(offload_policy=OFFLOAD, reshard_after_forward=True)(cfg))),
]


def test_fsdp2_two_ranks(request: pytest.FixtureRequest) -> None:
    if not is_worker():
        TWO_RANKS.check(request)
        return
    join_launch_group()  # initialize_distributed reuses it
    env = initialize_distributed(tiny_cfg())
    assert env.world_size == 2
    _check_meta_build_is_sharded_and_exact()
    run_cases(CASES, lambda: tiny_cfg(fsdp2=True))


def _check_meta_build_is_sharded_and_exact() -> None:
    """Odd sizes (ffn 51: shards of 26 and 25 rows) exercise FSDP2's uneven sharding of the meta build."""
    model_options = {"ffn_hidden_size": 51, "params_dtype": "float32"}
    torch.manual_seed(7)
    direct = build_model_chunks(tiny_cfg(**model_options).model, device="cpu")[0].state_dict()
    cfg = tiny_cfg(fsdp2=True, init_model_with_meta_device=True, **model_options)
    torch.manual_seed(7)
    backend = ddp_wrap(build_model_chunks(cfg.model, device="cpu"), cfg, torch.device("cpu"))
    model = backend.chunks[0]
    gate = model.layers[0].mlp.gate_proj.weight
    assert isinstance(gate, DTensor) and gate.to_local().shape[0] == (26 if dist.get_rank() == 0 else 25)
    state = backend.model_state_dict()["model"]
    assert state.keys() == direct.keys()
    for key, value in direct.items():
        full = state[key].full_tensor() if isinstance(state[key], DTensor) else state[key]
        assert torch.equal(full, value), key
