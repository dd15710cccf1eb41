"""This library's torch-native engine (``model.engine="native"``): its decoder (:mod:`megatron_bridge.models`), the
data-parallel backends of :mod:`megatron_bridge.distributed` (torch DDP, FSDP2, Megatron FSDP), torch's AdamW/SGD,
``torch.amp.GradScaler`` for fp16 and torch's pipeline schedules (:mod:`megatron_bridge.distributed.pipeline`)."""

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from megatron_bridge.engines.base import NATIVE_CHECKPOINTS, ForwardStep, PipelineRunner
from megatron_bridge.errors import ConfigValidationError, MegatronBridgeError
from megatron_bridge.models.loss import forward_step


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.distributed.base import DataParallelBackend

MEGATRON_FSDP_MODULE = "megatron_bridge.distributed.megatron_fsdp"


class BackendNotAvailableError(MegatronBridgeError, NotImplementedError):
    """The config selects a data-parallel backend this installation does not provide."""


def _megatron_fsdp_backend() -> type["DataParallelBackend"]:
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


class NativeEngine:
    """The native engine's parts of a run (:class:`~megatron_bridge.engines.base.Engine`)."""

    name = "native"
    checkpoint = NATIVE_CHECKPOINTS

    def build_model_chunks(self, cfg: "ConfigContainer", device: torch.device, pp_rank: int) -> list[nn.Module]:
        """This rank's ``LlamaModel`` chunks: its pipeline stages (the whole model without PP)."""
        from megatron_bridge.models.provider import build_model_chunks

        return build_model_chunks(cfg.model, device=device, pp_rank=pp_rank)

    def backend_class(self, cfg: "ConfigContainer") -> type["DataParallelBackend"]:
        """``dist.use_megatron_fsdp`` → Megatron FSDP (imported lazily), ``dist.use_torch_fsdp2`` → FSDP2, else
        torch DDP.

        Raises:
            BackendNotAvailableError: ``dist.use_megatron_fsdp`` while the Megatron FSDP backend module is missing.
        """
        if cfg.dist.use_megatron_fsdp:
            return _megatron_fsdp_backend()
        if cfg.dist.use_torch_fsdp2:
            from megatron_bridge.distributed.fsdp2 import FSDP2Backend

            return FSDP2Backend
        from megatron_bridge.distributed.ddp import DDPBackend

        return DDPBackend

    def build_optimizer(self, cfg: "ConfigContainer", chunks: list[nn.Module], device: torch.device) -> Any:
        """torch's AdamW or SGD (:func:`.optimizer.build_optimizer`)."""
        from megatron_bridge.engines.native.optimizer import build_optimizer

        return build_optimizer(cfg, chunks, device)

    def grad_scaler(self, cfg: "ConfigContainer", device: torch.device, optimizer: Any) -> Any:
        """``torch.amp.GradScaler`` with fp16 (static with ``optimizer.loss_scale``, else dynamic)."""
        o = cfg.optimizer
        if not o.fp16:
            return None
        static = o.loss_scale is not None
        return torch.amp.GradScaler(device.type, init_scale=o.loss_scale if static else o.initial_loss_scale,
                                    growth_factor=1.0 if static else 2.0, backoff_factor=1.0 if static else 0.5)

    def pipeline_runner(self, cfg: "ConfigContainer", backend: "DataParallelBackend", device: torch.device,
                        n_microbatches: int, step: ForwardStep) -> PipelineRunner | None:
        """torch's pipeline schedule under PP > 1; the last stage computes the default loss itself (``step`` is the
        default forward step, :meth:`check_forward_step`)."""
        if cfg.model.pipeline_model_parallel_size <= 1:
            return None
        from megatron_bridge.distributed.pipeline import PipelineRunner as TorchPipelineRunner

        return TorchPipelineRunner(cfg, backend, device, n_microbatches)

    def default_forward_step(self) -> Callable[..., Any]:
        """:func:`megatron_bridge.models.loss.forward_step`."""
        return forward_step

    def check_forward_step(self, cfg: "ConfigContainer", forward_step_func: Callable[..., Any]) -> None:
        """Under pipeline parallelism the schedule runs the stages and the last one computes the default loss: a
        custom forward step is refused there."""
        if cfg.model.pipeline_model_parallel_size > 1 and forward_step_func is not forward_step:
            raise ConfigValidationError(
                f"a custom forward_step_func ({getattr(forward_step_func, '__name__', forward_step_func)!r}) with "
                f"model.pipeline_model_parallel_size={cfg.model.pipeline_model_parallel_size}: under pipeline "
                "parallelism the schedule runs the model stage by stage and the last stage computes the masked "
                "next-token loss itself; use the default forward step or PP=1", ("model.pipeline_model_parallel_size",))

    def moe_tracker(self, cfg: "ConfigContainer", chunks: list[nn.Module], device: torch.device,
                    world_size: int) -> Any:
        """:class:`~megatron_bridge.engines.native.moe_stats.MoETracker` over the native MoE layers of ``chunks``."""
        from megatron_bridge.engines.native.moe_stats import MoETracker, moe_token_copies

        return MoETracker.for_chunks(chunks, device, moe_token_copies(cfg), cfg.model)

    def mtp_tracker(self, cfg: "ConfigContainer", chunks: list[nn.Module], device: torch.device) -> Any:
        """:class:`~megatron_bridge.engines.native.mtp_stats.MTPTracker` over the MTP modules of ``chunks``."""
        from megatron_bridge.engines.native.mtp_stats import MTPTracker

        return MTPTracker.for_chunks(chunks, device, cfg.model.mtp_depths)

    def destroy_groups(self) -> None:
        """Nothing: the native engine's groups are the device mesh's, destroyed with the default group."""
