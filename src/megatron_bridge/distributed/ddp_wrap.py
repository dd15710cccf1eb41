"""``ddp_wrap``: the one factory that turns model chunks into a data-parallel backend.

``model.engine="megatron_core"`` chunks (megatron-core ``GPTModel``), as Megatron-Bridge's ``_ddp_wrap``:
``dist.use_megatron_fsdp`` → megatron-core's Megatron FSDP adapter
(:class:`~megatron_bridge.distributed.mcore_fsdp.MegatronCoreFSDPBackend`), ``dist.use_torch_fsdp2`` → megatron-core's
``TorchFullyShardedDataParallel`` (:class:`~megatron_bridge.distributed.mcore_fsdp2.MegatronCoreFSDP2Backend`), else
megatron-core's DistributedDataParallel (:class:`~megatron_bridge.distributed.mcore_ddp.MegatronCoreDDPBackend`).
Native chunks:

``dist.use_megatron_fsdp`` → Megatron FSDP (:mod:`megatron_bridge.distributed.megatron_fsdp`, imported lazily),
``dist.use_torch_fsdp2`` → PyTorch FSDP2 (:class:`~megatron_bridge.distributed.fsdp2.FSDP2Backend`), else torch DDP
(:class:`~megatron_bridge.distributed.ddp.DDPBackend`). The training loop only sees the
:class:`~megatron_bridge.distributed.base.DataParallelBackend` interface.
"""

import importlib
from typing import TYPE_CHECKING

import torch
from torch import nn

from megatron_bridge.distributed.base import DataParallelBackend
from megatron_bridge.errors import MegatronBridgeError


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

MEGATRON_FSDP_MODULE = "megatron_bridge.distributed.megatron_fsdp"


class BackendNotAvailableError(MegatronBridgeError, NotImplementedError):
    """The config selects a data-parallel backend this installation does not provide."""


def select_backend_class(cfg: "ConfigContainer") -> type[DataParallelBackend]:
    """The backend class the config selects (see the module docstring).

    Raises:
        BackendNotAvailableError: ``dist.use_megatron_fsdp`` while the Megatron FSDP backend module is missing.
    """
    if cfg.model.engine == "megatron_core":
        return _megatron_core_backend(cfg)
    if cfg.dist.use_megatron_fsdp:
        return _megatron_fsdp_backend()
    if cfg.dist.use_torch_fsdp2:
        from megatron_bridge.distributed.fsdp2 import FSDP2Backend

        return FSDP2Backend
    from megatron_bridge.distributed.ddp import DDPBackend

    return DDPBackend


def _megatron_core_backend(cfg: "ConfigContainer") -> type[DataParallelBackend]:
    if cfg.dist.use_megatron_fsdp:
        from megatron_bridge.distributed.mcore_fsdp import MegatronCoreFSDPBackend

        return MegatronCoreFSDPBackend
    if cfg.dist.use_torch_fsdp2:
        from megatron_bridge.distributed.mcore_fsdp2 import MegatronCoreFSDP2Backend

        return MegatronCoreFSDP2Backend
    from megatron_bridge.distributed.mcore_ddp import MegatronCoreDDPBackend

    return MegatronCoreDDPBackend


def _megatron_fsdp_backend() -> type[DataParallelBackend]:
    try:
        module = importlib.import_module(MEGATRON_FSDP_MODULE)
    except ImportError as exc:
        if exc.name not in (None, MEGATRON_FSDP_MODULE):  # a dependency of the backend is missing: say so
            raise
        raise BackendNotAvailableError(
            "dist.use_megatron_fsdp=True, but the Megatron FSDP backend (megatron_bridge.distributed.megatron_fsdp) "
            "is not available in this version: set dist.use_megatron_fsdp=False (and ddp.use_megatron_fsdp=False) "
            "and use dist.use_torch_fsdp2=True or DDP."
        ) from exc
    return module.MegatronFSDPBackend


def ddp_wrap(model_chunks: list[nn.Module], cfg: "ConfigContainer", device: torch.device) -> DataParallelBackend:
    """Wrap ``model_chunks`` with the backend ``cfg`` selects; returns the backend (``.chunks`` = wrapped chunks).

    Initializes the default process group when none exists (a 1-process group outside torchrun). Meta-device
    chunks (``model.init_model_with_meta_device``) are materialized by the backend.
    """
    backend = select_backend_class(cfg)(cfg, torch.device(device))
    backend.wrap(model_chunks)
    return backend
