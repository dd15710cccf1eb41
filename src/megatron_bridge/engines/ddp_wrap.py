"""``ddp_wrap``: the one factory that turns model chunks into a data-parallel backend, the one of the config's engine
(:meth:`megatron_bridge.engines.base.Engine.backend_class`).

``model.engine="megatron_core"`` chunks (megatron-core ``GPTModel``), as Megatron-Bridge's ``_ddp_wrap``:
``dist.use_megatron_fsdp`` → megatron-core's Megatron FSDP adapter
(:class:`~megatron_bridge.engines.megatron_core.megatron_fsdp.MegatronCoreFSDPBackend`), ``dist.use_torch_fsdp2`` →
megatron-core's
``TorchFullyShardedDataParallel`` (:class:`~megatron_bridge.engines.megatron_core.fsdp2.MegatronCoreFSDP2Backend`), else
megatron-core's DistributedDataParallel (:class:`~megatron_bridge.engines.megatron_core.ddp.MegatronCoreDDPBackend`).
Native chunks:

``dist.use_megatron_fsdp`` → Megatron FSDP (:mod:`megatron_bridge.distributed.megatron_fsdp`, imported lazily),
``dist.use_torch_fsdp2`` → PyTorch FSDP2 (:class:`~megatron_bridge.distributed.fsdp2.FSDP2Backend`), else torch DDP
(:class:`~megatron_bridge.distributed.ddp.DDPBackend`). The training loop only sees the
:class:`~megatron_bridge.distributed.base.DataParallelBackend` interface.
"""

from typing import TYPE_CHECKING

import torch
from torch import nn

from megatron_bridge.distributed.base import DataParallelBackend
from megatron_bridge.engines.native.engine import MEGATRON_FSDP_MODULE, BackendNotAvailableError


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

__all__ = ["MEGATRON_FSDP_MODULE", "BackendNotAvailableError", "ddp_wrap", "select_backend_class"]


def select_backend_class(cfg: "ConfigContainer") -> type[DataParallelBackend]:
    """The backend class the config selects: its engine's (see the module docstring).

    Raises:
        BackendNotAvailableError: ``dist.use_megatron_fsdp`` while the Megatron FSDP backend module is missing.
    """
    from megatron_bridge.engines.factory import get_engine

    return get_engine(cfg).backend_class(cfg)


def ddp_wrap(model_chunks: list[nn.Module], cfg: "ConfigContainer", device: torch.device) -> DataParallelBackend:
    """Wrap ``model_chunks`` with the backend ``cfg`` selects; returns the backend (``.chunks`` = wrapped chunks).

    Initializes the default process group when none exists (a 1-process group outside torchrun). Meta-device
    chunks (``model.init_model_with_meta_device``) are materialized by the backend.
    """
    backend = select_backend_class(cfg)(cfg, torch.device(device))
    backend.wrap(model_chunks)
    return backend
