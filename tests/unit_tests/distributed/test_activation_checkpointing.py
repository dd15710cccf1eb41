"""Activation checkpointing: modes, scopes, MLP-only, Megatron recompute knobs, memory and gradients."""

import gc
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from megatron_bridge.distributed.activation_checkpointing import (
    ac_settings,
    apply_activation_checkpointing,
    normalize_mode,
)
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.models.llama import LlamaMLP
from tests.unit_tests.distributed.helpers import batch, build, count_modules, tiny_cfg


def _model(num_layers: int = 3, **model: object) -> nn.Module:
    return build(tiny_cfg(num_layers=num_layers, **model))[0]


@pytest.mark.parametrize(("mode", "expected"), [(False, None), (None, None), (True, "full"), ("full", "full"),
                                                ("selective", "selective")])
def test_modes(mode: object, expected: str | None) -> None:
    assert normalize_mode(mode) == expected  # type: ignore[arg-type]


def test_unknown_mode_names_the_option() -> None:
    with pytest.raises(ValueError, match="ddp.activation_checkpointing='partial'"):
        normalize_mode("partial", "ddp.activation_checkpointing")  # type: ignore[arg-type]


@pytest.mark.parametrize(("scope", "wrapped"), [(["all"], 3), (["language"], 3), (["vision"], 0), (["audio"], 0),
                                                (["multimodal"], 0)])
def test_scope_selects_decoder_blocks(scope: list[str], wrapped: int) -> None:
    model = _model()
    assert apply_activation_checkpointing(model, True, scope) == wrapped
    assert count_modules(model, CheckpointWrapper) == wrapped
    assert all(isinstance(b, CheckpointWrapper) == bool(wrapped) for b in model.layers)


def test_frozen_blocks_are_not_checkpointed_and_wrapping_is_idempotent() -> None:
    model = _model()
    model.layers[1].requires_grad_(False)
    assert apply_activation_checkpointing(model, "full") == 2
    assert apply_activation_checkpointing(model, "full") == 0
    assert not isinstance(model.layers[1], CheckpointWrapper)


def test_mlp_only_wraps_each_mlp() -> None:
    model = _model()
    assert apply_activation_checkpointing(model, "full", mlp_only=True) == 3
    assert all(isinstance(b.mlp, CheckpointWrapper) for b in model.layers)
    assert not any(isinstance(b, CheckpointWrapper) for b in model.layers)
    assert count_modules(model, LlamaMLP) == 3


def test_state_dict_keys_unchanged() -> None:
    model = _model()
    keys = list(model.state_dict())
    apply_activation_checkpointing(model, "selective")
    assert list(model.state_dict()) == keys


def test_backend_options_map_to_settings() -> None:
    cfg = tiny_cfg()
    assert ac_settings(cfg, "ddp").mode is None
    cfg.ddp.activation_checkpointing = "selective"
    cfg.ddp.activation_checkpointing_scope = ["language"]
    s = ac_settings(cfg, "ddp")
    assert (s.mode, s.scope, s.mlp_only, s.max_blocks) == ("selective", ("language",), False, None)
    cfg.fsdp2.mlp_activation_checkpointing = True
    s = ac_settings(cfg, "fsdp2")
    assert (s.mode, s.mlp_only) == ("full", True)
    cfg.fsdp2.activation_checkpointing = True  # whole blocks win over the MLP-only variant
    assert ac_settings(cfg, "fsdp2").mlp_only is False


def test_megatron_recompute_knobs() -> None:
    cfg = tiny_cfg()
    cfg.model.recompute_granularity = "full"
    cfg.model.recompute_method = "block"
    cfg.model.recompute_num_layers = 2
    s = ac_settings(cfg, "fsdp2")
    assert (s.mode, s.max_blocks, s.source) == ("full", 2, "model.recompute_granularity")
    model = _model()
    assert apply_activation_checkpointing(model, s.mode, s.scope, max_blocks=s.max_blocks) == 2
    assert [isinstance(b, CheckpointWrapper) for b in model.layers] == [True, True, False]
    cfg.model.recompute_method = "uniform"
    assert ac_settings(cfg, "ddp").max_blocks is None
    cfg.model.recompute_granularity = "selective"
    assert ac_settings(cfg, "ddp").mode == "selective"


def test_block_recompute_needs_num_layers() -> None:
    cfg = tiny_cfg()
    cfg.model.recompute_granularity, cfg.model.recompute_method = "full", "block"
    with pytest.raises(ConfigValidationError) as info:
        ac_settings(cfg, "ddp")
    assert info.value.paths == ("model.recompute_num_layers",)


class _LiveStorages(TorchDispatchMode):
    """Records every storage an op creates; ``live_bytes`` counts those still alive (kept for backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                self.storages.setdefault(storage._cdata, (StorageWeakRef(storage), storage.nbytes()))
        return out

    def live_bytes(self) -> int:
        gc.collect()
        return sum(n for ref, n in self.storages.values() if not ref.expired())


def _activation_bytes(model: nn.Module, ids: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Bytes of forward intermediates alive after forward (what backward keeps), and the loss."""
    tracker = _LiveStorages()
    with tracker:
        loss = model(ids, labels=ids).mean()
    return tracker.live_bytes(), loss


def _grads_after(prepare: Callable[[nn.Module], object], ids: torch.Tensor) -> tuple[int, dict[str, torch.Tensor]]:
    model = _model(num_layers=4, hidden_size=64, ffn_hidden_size=128, seq_length=64)
    prepare(model)
    saved, loss = _activation_bytes(model, ids)
    loss.backward()
    prefix = "_checkpoint_wrapped_module."
    return saved, {n.replace(prefix, ""): p.grad.clone() for n, p in model.named_parameters()}


def test_selective_saves_less_than_none_and_full_less_than_selective_with_equal_grads() -> None:
    """Saved-activation bytes are measured as forward outputs still alive after forward: saved-tensor hooks do not
    see inside a non-reentrant checkpoint region, nor the outputs SAC keeps in its own cache."""
    ids = torch.randint(0, 100, (4, 64), generator=torch.Generator().manual_seed(0))
    none_bytes, ref = _grads_after(lambda m: None, ids)
    sel_bytes, sel = _grads_after(lambda m: apply_activation_checkpointing(m, "selective"), ids)
    full_bytes, full = _grads_after(lambda m: apply_activation_checkpointing(m, "full"), ids)
    print(f"saved activation bytes: none {none_bytes}, selective {sel_bytes}, full {full_bytes}")
    assert full_bytes < sel_bytes < none_bytes, (full_bytes, sel_bytes, none_bytes)
    assert sel_bytes < 0.8 * none_bytes and full_bytes < 0.6 * sel_bytes, (full_bytes, sel_bytes, none_bytes)
    for name, grad in ref.items():
        torch.testing.assert_close(sel[name], grad, rtol=0, atol=1e-6)
        torch.testing.assert_close(full[name], grad, rtol=0, atol=1e-6)


def test_batch_helper_is_deterministic() -> None:
    assert torch.equal(batch(), batch())
