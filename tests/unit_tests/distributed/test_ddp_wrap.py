"""The backend factory: selection by config, the Megatron FSDP import guard."""

import importlib.util
import sys

import pytest
import torch

from megatron_bridge.distributed.ddp import DDPBackend
from megatron_bridge.distributed.fsdp2 import FSDP2Backend
from megatron_bridge.engines.ddp_wrap import (
    MEGATRON_FSDP_MODULE,
    BackendNotAvailableError,
    ddp_wrap,
    select_backend_class,
)
from megatron_bridge.errors import MegatronBridgeError
from tests.unit_tests.distributed.helpers import batch, build, tiny_cfg


def test_default_is_ddp_and_fsdp2_flag_selects_fsdp2() -> None:
    assert select_backend_class(tiny_cfg()) is DDPBackend
    assert select_backend_class(tiny_cfg(fsdp2=True)) is FSDP2Backend


def test_megatron_fsdp_selects_its_backend_when_present() -> None:
    if importlib.util.find_spec(MEGATRON_FSDP_MODULE) is None:
        pytest.skip("the Megatron FSDP backend module is not in this tree yet")
    cfg = tiny_cfg()
    cfg.dist.use_megatron_fsdp = True
    assert select_backend_class(cfg).__name__ == "MegatronFSDPBackend"


def test_missing_megatron_fsdp_backend_is_a_named_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, MEGATRON_FSDP_MODULE, None)  # makes the import fail like a missing module
    cfg = tiny_cfg()
    cfg.dist.use_megatron_fsdp = True
    with pytest.raises(BackendNotAvailableError, match="dist.use_megatron_fsdp") as info:
        select_backend_class(cfg)
    assert isinstance(info.value, MegatronBridgeError) and isinstance(info.value, NotImplementedError)


@pytest.mark.parametrize("fsdp2", [False, True])
def test_ddp_wrap_returns_the_backend_with_wrapped_chunks(fsdp2: bool) -> None:
    cfg = tiny_cfg(fsdp2=fsdp2)
    backend = ddp_wrap(build(cfg), cfg, torch.device("cpu"))
    assert backend.name == ("fsdp2" if fsdp2 else "ddp") and len(backend.chunks) == 1
    loss = backend.chunks[0](batch(), labels=batch()).mean()
    loss.backward()
    assert all(p.grad is not None for p in backend.parameters())
