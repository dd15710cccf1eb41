"""The megatron-core engine's parts of a run (``model.engine="megatron_core"``): ``GPTModel`` chunks
(:mod:`.provider`), megatron-core's DDP / Megatron FSDP / FSDP2 wrappers (:mod:`.ddp`, :mod:`.megatron_fsdp`,
:mod:`.fsdp2`), its optimizer (:mod:`.optimizer`) and loss scaler (:mod:`.precision`), its pipeline schedules
(:mod:`.pipeline`) and forward step (:mod:`.forward_step`). Every module is imported when first asked for."""

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from megatron_bridge.engines.base import MEGATRON_CORE_CHECKPOINTS, ForwardStep, PipelineRunner


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.distributed.base import DataParallelBackend


class MegatronCoreEngine:
    """The megatron-core engine (:class:`~megatron_bridge.engines.base.Engine`)."""

    name = "megatron_core"
    checkpoint = MEGATRON_CORE_CHECKPOINTS

    def build_model_chunks(self, cfg: "ConfigContainer", device: torch.device, pp_rank: int) -> list[nn.Module]:
        """megatron-core's parallel state and this rank's ``GPTModel`` chunks (:func:`.provider.build_gpt_chunks`;
        megatron-core places the stages itself)."""
        from megatron_bridge.engines.megatron_core.provider import build_gpt_chunks

        return build_gpt_chunks(cfg, device)

    def backend_class(self, cfg: "ConfigContainer") -> type["DataParallelBackend"]:
        """As Megatron-Bridge's ``_ddp_wrap``: ``dist.use_megatron_fsdp`` → megatron-core's Megatron FSDP adapter,
        ``dist.use_torch_fsdp2`` → its ``TorchFullyShardedDataParallel``, else its DistributedDataParallel."""
        if cfg.dist.use_megatron_fsdp:
            from megatron_bridge.engines.megatron_core.megatron_fsdp import MegatronCoreFSDPBackend

            return MegatronCoreFSDPBackend
        if cfg.dist.use_torch_fsdp2:
            from megatron_bridge.engines.megatron_core.fsdp2 import MegatronCoreFSDP2Backend

            return MegatronCoreFSDP2Backend
        from megatron_bridge.engines.megatron_core.ddp import MegatronCoreDDPBackend

        return MegatronCoreDDPBackend

    def build_optimizer(self, cfg: "ConfigContainer", chunks: list[nn.Module], device: torch.device) -> Any:
        """megatron-core's ``get_megatron_optimizer`` (:func:`.optimizer.build_megatron_optimizer`)."""
        from megatron_bridge.engines.megatron_core.optimizer import build_megatron_optimizer

        return build_megatron_optimizer(cfg, chunks)

    def grad_scaler(self, cfg: "ConfigContainer", device: torch.device, optimizer: Any) -> Any:
        """With fp16, megatron-core's own loss scaler inside its optimizer
        (:class:`.precision.MegatronCoreLossScaler`)."""
        if not cfg.optimizer.fp16:
            return None
        from megatron_bridge.engines.megatron_core.precision import MegatronCoreLossScaler

        return MegatronCoreLossScaler(optimizer)

    def pipeline_runner(self, cfg: "ConfigContainer", backend: "DataParallelBackend", device: torch.device,
                        n_microbatches: int, step: ForwardStep) -> PipelineRunner | None:
        """megatron-core's schedule over its chunks under PP > 1, running ``step``."""
        if cfg.model.pipeline_model_parallel_size <= 1:
            return None
        from megatron_bridge.engines.megatron_core.pipeline import MegatronCorePipelineRunner

        return MegatronCorePipelineRunner(cfg, backend, step, n_microbatches)

    def default_forward_step(self) -> Callable[..., Any]:
        """:func:`.forward_step.megatron_core_forward_step` (``GPTModel``'s argument order)."""
        from megatron_bridge.engines.megatron_core.forward_step import megatron_core_forward_step

        return megatron_core_forward_step

    def check_forward_step(self, cfg: "ConfigContainer", forward_step_func: Callable[..., Any]) -> None:
        """Nothing to refuse: megatron-core's schedules run every Megatron-Bridge form (``pretrain`` checks the form
        first), and a step written for the native model's call ``model(tokens, position_ids=..., labels=...)`` runs on
        ``GPTModel`` too (:func:`.forward_step.accept_native_call`, a pre-hook on every chunk)."""

    def moe_tracker(self, cfg: "ConfigContainer", chunks: list[nn.Module], device: torch.device,
                    world_size: int) -> Any:
        """:class:`.moe.MegatronCoreMoETracker` for an MoE model (megatron-core's aux-loss scale and logged losses)."""
        if not cfg.model.is_moe:
            return None
        from megatron_bridge.engines.megatron_core.moe import MegatronCoreMoETracker

        return MegatronCoreMoETracker(cfg.model, device, world_size)

    def mtp_tracker(self, cfg: "ConfigContainer", chunks: list[nn.Module], device: torch.device) -> Any:
        """None: multi-token prediction is refused on this engine (rule megatron_core_features)."""
        return None

    def destroy_groups(self) -> None:
        """Reset megatron-core's parallel state, if this process created it (:func:`.parallel_state.destroy`)."""
        from megatron_bridge.engines.megatron_core.parallel_state import destroy

        destroy()
