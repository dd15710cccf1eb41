"""FSDP2 backend: every cfg.fsdp2 option reaches fully_shard and the FSDP state (world size 1, gloo)."""

import logging

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

from megatron_bridge.config.distributed import FSDP2MixedPrecisionPolicy, FSDP2OffloadPolicy
from megatron_bridge.distributed.fsdp2 import FSDP2Backend
from megatron_bridge.distributed.fsdp2_sharding import maybe_patch_is_packed_sequence
from megatron_bridge.engines.ddp_wrap import ddp_wrap
from megatron_bridge.errors import ConfigValidationError, TrainingError
from tests.unit_tests.distributed.helpers import batch, build, count_modules, full_state, tiny_cfg


CPU = torch.device("cpu")


def _wrap(cfg, chunks: list[nn.Module] | None = None) -> FSDP2Backend:  # noqa: ANN001
    backend = ddp_wrap(chunks or build(cfg), cfg, CPU)
    assert isinstance(backend, FSDP2Backend)
    return backend


def _group(module: nn.Module):  # noqa: ANN202
    return module._get_fsdp_state()._fsdp_param_group


def _reshards(module: nn.Module) -> bool:
    return _group(module).post_forward_mesh_info is not None


def _policy(cfg) -> MixedPrecisionPolicy:  # noqa: ANN001
    return _group(_wrap(cfg).chunks[0]).mp_policy


def test_blocks_and_root_are_units() -> None:
    model = _wrap(tiny_cfg(fsdp2=True)).chunks[0]
    assert isinstance(model, FSDPModule) and all(isinstance(b, FSDPModule) for b in model.layers)
    assert not isinstance(model.embed_tokens, FSDPModule)
    assert isinstance(model.embed_tokens.weight, DTensor)  # in the root unit


def test_mp_policy_follows_the_preset_when_unset() -> None:
    fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, output_dtype=torch.float32)
    assert _policy(tiny_cfg(fsdp2=True)) == fp32
    cfg = tiny_cfg(fsdp2=True)
    cfg.mixed_precision = "bf16_mixed"
    cfg.finalize()
    assert _policy(cfg) == MixedPrecisionPolicy(torch.bfloat16, torch.float32, torch.bfloat16)


def test_explicit_mp_policy_is_used() -> None:
    cfg = tiny_cfg(fsdp2=True)
    cfg.fsdp2.mp_policy = FSDP2MixedPrecisionPolicy(param_dtype="bfloat16", reduce_dtype="float32",
                                                    output_dtype="float32", cast_forward_inputs=False)
    assert _policy(cfg) == MixedPrecisionPolicy(torch.bfloat16, torch.float32, torch.float32, False)


@pytest.mark.parametrize(("reshard", "expected"), [(None, [True, True, False]), (True, [True] * 3),
                                                   (False, [False] * 3)])
def test_reshard_after_forward(reshard: bool | None, expected: list[bool]) -> None:
    cfg = tiny_cfg(fsdp2=True)
    cfg.fsdp2.reshard_after_forward = reshard
    model = _wrap(cfg).chunks[0]
    assert [_reshards(b) for b in model.layers] == expected
    assert _reshards(model) is False


def _prefetch(module: nn.Module, blocks: nn.ModuleList) -> tuple[list[int], list[int]]:
    state = module._get_fsdp_state()
    index = {id(b._get_fsdp_state()): i for i, b in enumerate(blocks)}
    return ([index[id(s)] for s in state._states_to_forward_prefetch],
            [index[id(s)] for s in state._states_to_backward_prefetch])


@pytest.mark.parametrize(("enable", "reshard", "fwd", "bwd", "expected"), [
    (True, None, 1, 2, [([1], []), ([2], [0]), ([3], [1, 0]), ([], [2, 1])]),
    (True, True, 2, 1, [([1, 2], []), ([2, 3], [0]), ([3], [1]), ([], [2])]),
    (True, None, 0, 0, [([], [])] * 4),
    (False, None, 1, 2, [([], [])] * 4),
    (True, False, 1, 2, [([], [])] * 4),
])
def test_prefetch_chains(enable: bool, reshard: bool | None, fwd: int, bwd: int, expected: list) -> None:
    cfg = tiny_cfg(fsdp2=True, num_layers=4)
    f = cfg.fsdp2
    f.enable_fsdp2_prefetch, f.reshard_after_forward = enable, reshard
    f.fsdp2_forward_prefetch_depth, f.fsdp2_backward_prefetch_depth = fwd, bwd
    model = _wrap(cfg).chunks[0]
    assert [_prefetch(b, model.layers) for b in model.layers] == expected


def test_cpu_offload_policy() -> None:
    cfg = tiny_cfg(fsdp2=True)
    cfg.fsdp2.offload_policy = FSDP2OffloadPolicy(pin_memory=False)
    model = _wrap(cfg).chunks[0]
    policy = _group(model.layers[0]).offload_policy
    assert isinstance(policy, CPUOffloadPolicy) and policy.pin_memory is False
    loss = model(batch(), labels=batch()).mean()
    loss.backward()
    assert all(p.grad.device.type == "cpu" for p in model.parameters())


def test_pinned_offload_without_accelerator_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    cfg = tiny_cfg(fsdp2=True)
    cfg.fsdp2.offload_policy = FSDP2OffloadPolicy(pin_memory=True)
    with pytest.raises(ConfigValidationError, match="pin_memory=False") as info:
        FSDP2Backend(cfg, CPU)
    assert info.value.paths == ("fsdp2.offload_policy.pin_memory",)


def _reduce_flags(model: nn.Module) -> set[bool]:
    return {_group(m).reduce_grads for m in model.modules() if isinstance(m, FSDPModule)}


@pytest.mark.parametrize(("defer", "not_last", "last"), [(True, {False}, {True}), (False, {True}, {True})])
def test_defer_grad_sync(defer: bool, not_last: set[bool], last: set[bool]) -> None:
    cfg = tiny_cfg(fsdp2=True)
    cfg.fsdp2.defer_fsdp_grad_sync = defer
    backend = _wrap(cfg)
    with backend.grad_sync_context(is_last_microbatch=False):
        assert _reduce_flags(backend.chunks[0]) == not_last
    with backend.grad_sync_context(is_last_microbatch=True):
        assert _reduce_flags(backend.chunks[0]) == last


@pytest.mark.parametrize(("ac", "mlp", "scope", "blocks", "mlps"), [
    (True, False, ["all"], 3, 0), ("selective", False, ["language"], 3, 0), (False, True, ["all"], 0, 3),
    ("full", False, ["vision"], 0, 0),
])
def test_activation_checkpointing(ac: object, mlp: bool, scope: list[str], blocks: int, mlps: int) -> None:
    cfg = tiny_cfg(fsdp2=True)
    f = cfg.fsdp2
    f.activation_checkpointing, f.mlp_activation_checkpointing, f.activation_checkpointing_scope = ac, mlp, scope
    model = _wrap(cfg).chunks[0]
    assert sum(isinstance(b, CheckpointWrapper) for b in model.layers) == blocks
    assert sum(isinstance(b.mlp, CheckpointWrapper) for b in model.layers) == mlps
    assert count_modules(model, CheckpointWrapper) == blocks + mlps
    assert set(_wrap_state_keys(model)) == set(build(tiny_cfg())[0].state_dict())


def _wrap_state_keys(model: nn.Module) -> list[str]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return list(get_model_state_dict(model))


def _frozen_embedding_model(cfg) -> list[nn.Module]:  # noqa: ANN001
    chunks = build(cfg)
    chunks[0].embed_tokens.requires_grad_(False)
    return chunks


def test_frozen_policy_root() -> None:
    model = _wrap(cfg := tiny_cfg(fsdp2=True), _frozen_embedding_model(cfg)).chunks[0]
    assert not isinstance(model.embed_tokens, FSDPModule)
    assert isinstance(model.embed_tokens.weight, DTensor)
    assert any(p is model.embed_tokens.weight for p in (fp.sharded_param for fp in _group(model).fsdp_params))


def test_frozen_policy_per_layer() -> None:
    cfg = tiny_cfg(fsdp2=True)
    cfg.fsdp2.frozen_module_policy = "per_layer"
    model = _wrap(cfg, _frozen_embedding_model(cfg)).chunks[0]
    assert isinstance(model.embed_tokens, FSDPModule)
    assert isinstance(model.embed_tokens.weight, DTensor)


def test_frozen_policy_replicate() -> None:
    cfg = tiny_cfg(fsdp2=True)
    cfg.fsdp2.frozen_module_policy = "replicate"
    model = _wrap(cfg, _frozen_embedding_model(cfg)).chunks[0]
    weight = model.embed_tokens.weight
    assert not isinstance(model.embed_tokens, FSDPModule) and not isinstance(weight, DTensor)
    assert weight.shape == (cfg.model.padded_vocab_size, cfg.model.hidden_size)
    model(batch(), labels=batch()).mean().backward()
    assert weight.grad is None


def test_autocast_only_when_configured() -> None:
    cfg = tiny_cfg(fsdp2=True)
    cfg.mixed_precision = "bf16_mixed"
    cfg.finalize()
    backend = _wrap(cfg)
    with backend.forward_context():
        assert not torch.is_autocast_enabled("cpu")  # the preset goes to mp_policy, not autocast
    cfg.fsdp2.autocast_dtype = "bfloat16"
    backend = _wrap(cfg)
    with backend.forward_context():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


@pytest.fixture
def library_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Capture the library's records even when setup_logging() stopped propagation; reset warn_once keys."""
    from megatron_bridge.utils import logging as mb_logging

    mb_logging._WARNED_ONCE.clear()
    logger = logging.getLogger("megatron_bridge")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="megatron_bridge")
    yield caplog
    logger.removeHandler(caplog.handler)


def test_patch_is_packed_sequence_is_a_logged_noop_for_own_models(library_log: pytest.LogCaptureFixture) -> None:
    cfg = tiny_cfg(fsdp2=True)
    cfg.fsdp2.patch_is_packed_sequence = True
    _wrap(cfg)
    assert "patch_is_packed_sequence=True is a no-op for LlamaModel" in library_log.text
    assert maybe_patch_is_packed_sequence(build(cfg)[0], False) is False


def test_patch_is_packed_sequence_for_hugging_face_models(library_log: pytest.LogCaptureFixture) -> None:
    fake_hf = type("LlamaForCausalLM", (nn.Module,), {"__module__": "transformers.models.llama.modeling_llama"})
    try:
        import transformers.modeling_flash_attention_utils as fa_utils
    except ImportError:
        assert maybe_patch_is_packed_sequence(fake_hf(), True) is False
        assert "transformers is not importable" in library_log.text
        return
    assert maybe_patch_is_packed_sequence(fake_hf(), True) is True
    assert maybe_patch_is_packed_sequence(fake_hf(), True) is True  # idempotent
    assert fa_utils._is_packed_sequence(None) is False


def test_nan_gradient_norm_raises() -> None:
    cfg = tiny_cfg(fsdp2=True)
    cfg.ddp.check_for_nan_in_grad = True
    backend = _wrap(cfg)
    model = backend.chunks[0]
    model(batch(), labels=batch()).mean().backward()
    assert torch.isfinite(backend.clip_grad_norm(1.0))
    model.norm.weight.grad.to_local()[0] = float("inf")
    with pytest.raises(TrainingError, match="ddp.check_for_nan_in_grad"):
        backend.clip_grad_norm(1.0)


def test_clip_grad_norm_of_dtensor_grads_equals_reference() -> None:
    cfg = tiny_cfg(fsdp2=True)
    reference = build(cfg)[0]
    reference(batch(), labels=batch()).mean().backward()
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), float("inf"))
    backend = _wrap(cfg)
    backend.chunks[0](batch(), labels=batch()).mean().backward()
    norm = backend.clip_grad_norm(0.0)
    assert not isinstance(norm, DTensor)
    torch.testing.assert_close(norm, expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("params_dtype", ["float32", "bfloat16"])
def test_meta_device_build_equals_direct_build(params_dtype: str) -> None:
    direct = build(tiny_cfg(params_dtype=params_dtype), seed=5)[0].state_dict()
    cfg = tiny_cfg(fsdp2=True, init_model_with_meta_device=True, params_dtype=params_dtype)
    state = full_state(_wrap(cfg, build(cfg, seed=5)).model_state_dict()["model"])
    assert state.keys() == direct.keys()
    for key, value in direct.items():
        assert torch.equal(state[key], value), key
