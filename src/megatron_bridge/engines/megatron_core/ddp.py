"""The ``ddp_wrap`` backend of megatron-core chunks (``model.engine="megatron_core"``): megatron-core's
``DistributedDataParallel``, as Megatron-Bridge wraps its models.

Its ``DistributedDataParallelConfig`` comes from ``cfg.ddp`` (:func:`ddp_config`): gradient reduction in fp32, overlap
of gradient reduction and parameter gathering, bucket size, distributed optimizer, averaging inside the collective and
the NaN check. Under pipeline parallelism the chunks are this rank's (virtual) stages; megatron-core's schedule runs
them (:mod:`megatron_bridge.engines.megatron_core.pipeline`). Gradients accumulate in megatron-core's contiguous
``main_grad``
buffers; the optimizer is megatron-core's (:mod:`megatron_bridge.engines.megatron_core.optimizer`) and steps with its
own
clipping (:meth:`MegatronCoreDDPBackend.optimizer_step`). Checkpoints are megatron-core ``torch_dist`` folders
(:mod:`megatron_bridge.checkpoint.mcore_checkpoint`)."""

import logging
import math
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Any

import torch
from torch import nn

from megatron_bridge.distributed.base import DataParallelBackend
from megatron_bridge.errors import MegatronBridgeError, TrainingError
from megatron_bridge.utils.logging import get_logger, log_rank_0


logger = get_logger(__name__)


def ddp_config(cfg: Any) -> Any:
    """megatron-core's ``DistributedDataParallelConfig`` from ``cfg.ddp`` (Megatron-Bridge's field names)."""
    from megatron.core.distributed import DistributedDataParallelConfig

    from megatron_bridge.engines.megatron_core.precision import ddp_precision

    d = cfg.ddp
    return DistributedDataParallelConfig(
        **ddp_precision(cfg),
        overlap_grad_reduce=d.overlap_grad_reduce,
        overlap_param_gather=d.overlap_param_gather,
        use_distributed_optimizer=d.use_distributed_optimizer,
        check_for_nan_in_grad=d.check_for_nan_in_grad,
        bucket_size=d.bucket_size,
        average_in_collective=d.average_in_collective,
    )


class MegatronCoreDDPBackend(DataParallelBackend):
    """megatron-core ``DistributedDataParallel`` around each ``GPTModel`` chunk."""

    name = "mcore_ddp"

    def __init__(self, cfg: Any, device: torch.device) -> None:
        super().__init__(cfg, device)
        self.optimizer: Any = None

    def wrap(self, model_chunks: list[nn.Module]) -> list[nn.Module]:
        """Wrap every chunk; only the first one has gradient buckets (Megatron's rule for virtual stages)."""
        from megatron.core import parallel_state
        from megatron.core.distributed import DistributedDataParallel

        config = ddp_config(self.cfg)
        self.chunks = [
            DistributedDataParallel(chunk.config, config, chunk, disable_bucketing=i > 0)
            for i, chunk in enumerate(model_chunks)
        ]
        if self.pipelined:  # parameter norms are summed over the stages
            self.pp_group = parallel_state.get_pipeline_model_parallel_group()
        return self.chunks

    def prepare_optimizer(self, optimizer: Any) -> Any:
        """Keep megatron-core's optimizer (built by :meth:`.engine.MegatronCoreEngine.build_optimizer`) and let
        megatron-core's pipeline schedules scale the loss by its loss scale (``config.grad_scale_func``, as
        Megatron-Bridge sets it; 1 except with fp16). Without pipeline parallelism the loop scales the loss itself
        (:class:`~megatron_bridge.engines.megatron_core.precision.MegatronCoreLossScaler`)."""
        self.optimizer = optimizer
        for chunk in self.chunks:
            chunk.config.grad_scale_func = optimizer.scale_loss
        return optimizer

    def grad_sync_context(self, *, is_last_microbatch: bool) -> AbstractContextManager:
        """No gradient reduction before the last micro-batch (``no_sync`` of every chunk)."""
        if is_last_microbatch:
            return nullcontext()
        stack = ExitStack()
        for chunk in self.chunks:
            stack.enter_context(chunk.no_sync())
        return stack

    def finish_grad_sync(self) -> None:
        """megatron-core's ``finalize_model_grads``: reduce (or wait for the overlapped reduction of) the gradients of
        every chunk over the data-parallel ranks, all-reduce the sequence-parallel norms' gradients over TP and the
        tied embedding's over its first and last pipeline stage."""
        from megatron.core.distributed import finalize_model_grads

        finalize_model_grads(self.chunks)

    def zero_grad(self, optimizer: Any) -> None:
        """Zero megatron-core's gradient buffers and the optimizer's gradients."""
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        optimizer.zero_grad()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Not used: megatron-core's optimizer clips inside its step (:meth:`optimizer_step`)."""
        raise MegatronBridgeError("the megatron-core backend clips in optimizer_step (megatron-core's own step)")

    def unwrap(self, chunk: nn.Module) -> nn.Module:
        """The ``GPTModel`` inside megatron-core's DDP and, with bf16/fp16, its ``Float16Module``."""
        from megatron_bridge.engines.megatron_core.precision import unwrap_float16

        return unwrap_float16(getattr(chunk, "module", chunk))

    def optimizer_step(self, optimizer: Any, max_norm: float, grad_scaler: Any = None) -> float:
        """megatron-core's ``optimizer.step()``: copy the main gradients (unscaled by its fp16 loss scaler), clip by
        the global norm (its config's ``clip_grad``, which is ``optimizer.clip_grad``), step; returns the gradient
        norm before clipping. With fp16, a step whose gradients overflow is skipped and the loss scale lowered, as in
        Megatron (logged; the norm returned is inf); without a loss scaler, a skipped step is an error."""
        success, grad_norm, _ = optimizer.step()
        if not success:
            if self.cfg.optimizer.fp16:
                log_rank_0(logger, "fp16: gradients overflowed, step skipped; loss scale now %g",
                           float(optimizer.get_loss_scale()), level=logging.WARNING)
                return math.inf
            raise TrainingError("megatron-core's optimizer skipped the step (NaN/Inf gradients)")
        if grad_norm is None:  # clip_grad == 0: megatron-core does not compute the norm
            grad_norm = optimizer.get_grad_norm()
        return float(grad_norm)

    def parameters(self) -> list[nn.Parameter]:
        """The trainable parameters of the chunks."""
        return [p for chunk in self.chunks for p in chunk.parameters() if p.requires_grad]

    def model_state_dict(self) -> dict[str, Any]:
        """Not used: checkpoints of this backend are megatron-core ``sharded_state_dict``s
        (:mod:`megatron_bridge.checkpoint.mcore_checkpoint`)."""
        raise MegatronBridgeError("megatron-core chunks are checkpointed through their sharded_state_dict "
                                  "(megatron_bridge.checkpoint.mcore_checkpoint), not model_state_dict")

    def load_model_state_dict(self, state: dict[str, Any]) -> None:
        """Not used (see :meth:`model_state_dict`)."""
        self.model_state_dict()
