"""fsdp2.enable_compile: per-block torch.compile with checkpointing inside (slow: a cold compile takes ~30 s)."""

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from megatron_bridge.engines.ddp_wrap import ddp_wrap
from tests.unit_tests.distributed.helpers import batch, build, full_state, tiny_cfg


@pytest.mark.slow
def test_per_block_compile_with_activation_checkpointing_matches_eager() -> None:
    cfg = tiny_cfg(fsdp2=True, num_layers=2)
    cfg.fsdp2.activation_checkpointing = "full"
    cfg.fsdp2.enable_compile = True
    reference = build(cfg)[0]
    backend = ddp_wrap(build(cfg), cfg, torch.device("cpu"))
    model = backend.chunks[0]
    assert all(isinstance(b, CheckpointWrapper) and b._compiled_call_impl is not None for b in model.layers)
    assert model._compiled_call_impl is None  # no whole-model compile

    ids = batch()
    ref_loss = reference(ids, labels=ids).mean()
    ref_loss.backward()
    loss = model(ids, labels=ids).mean()
    loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    for name, p in reference.named_parameters():
        key = next(k for k in grads if k.replace("_checkpoint_wrapped_module.", "") == name)
        torch.testing.assert_close(grads[key], p.grad, rtol=1e-4, atol=1e-6)

    state = full_state(backend.model_state_dict()["model"])
    assert state.keys() == reference.state_dict().keys()  # no _orig_mod. prefixes
