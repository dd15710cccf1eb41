"""Pipeline parallelism of the megatron-core engine through megatron-core's own schedules.

:class:`MegatronCorePipelineRunner` has the interface of the native engine's
:class:`~megatron_bridge.distributed.pipeline.PipelineRunner` (``run(batches, scale=..., train=...)``), so the loop
(:func:`megatron_bridge.training.loop.train_step`, :func:`~megatron_bridge.training.loop.evaluate`) drives both the
same way. A step calls ``get_forward_backward_func()`` — megatron-core's 1F1B
(``forward_backward_pipelining_without_interleaving``) or, with virtual stages, its interleaved 1F1B
(``forward_backward_pipelining_with_interleaving``): ``model.pipeline_schedule`` None, "1F1B" or "Interleaved1F1B"
(rule ``megatron_core_pipeline`` refuses the others), chosen by megatron-core from the virtual stage count — over
this rank's DDP-wrapped ``GPTModel`` chunks, with the
step's micro-batches (``seq_length`` and ``micro_batch_size`` from the config; activations exchanged in
``TransformerConfig.pipeline_dtype``).

Every chunk runs the user's forward step (``forward_step(data_iterator, model)`` or ``(state, data_iterator,
model)``; by default :func:`~megatron_bridge.engines.megatron_core.forward_step.megatron_core_forward_step`) on its
own iterator over the step's micro-batches; megatron-core feeds the previous stage's activations through
``set_input_tensor``, and only
the last stage's loss function runs. Loss normalisation is the loop's: the loss function returns ``(loss_sum,
num_tokens, report)`` and the back-propagated loss is ``loss_sum × dp_size × cp_size / global_tokens`` (``scale``),
so the gradient is that of the token-weighted mean over the global batch, as at PP=1. megatron-core divides a
3-tuple loss by its token count and by the number of micro-batches (``calculate_per_token_loss=False``), so the loss
handed to it is ``loss_sum × scale × num_microbatches`` with a token count of 1 (exact for power-of-two micro-batch
counts, else within an ulp). Without a ``loss_mask`` (``scale=None``) it gets the real token count: the mean per
micro-batch, averaged over micro-batches, as the loop does at PP=1.

Gradient reduction: megatron-core's DDP ``no_sync`` of every chunk is the schedule's ``no_sync_func``; with
``ddp.overlap_grad_reduce`` each chunk's ``start_grad_sync`` is its ``grad_sync_func`` (reduction starts after the
chunk's last backward, as Megatron-LM aligns it). The loop then calls the backend's ``finish_grad_sync``, which is
megatron-core's ``finalize_model_grads`` (DP reduction, sequence-parallel norms, tied embeddings between the first
and last stage).
"""

from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from megatron_bridge.utils.logging import get_logger, log_rank_0


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.distributed.base import DataParallelBackend

logger = get_logger(__name__)

Batch = dict[str, torch.Tensor]
ForwardStep = Callable[[Iterator[Batch], torch.nn.Module], tuple[torch.Tensor, Callable[..., Any]]]


class MegatronCorePipelineRunner:
    """Runs megatron-core's pipeline schedule over the backend's megatron-core DDP chunks.

    Args:
        cfg: the run config (``model.*`` pipeline fields, ``train.micro_batch_size``).
        backend: the megatron-core DDP backend; ``backend.chunks`` are this rank's stages in virtual-stage order.
        forward_step: ``forward_step(data_iterator, model) -> (output, loss_func)`` (the loop binds a 3-argument
            step's ``state``).
        n_microbatches: micro-batches per step (``cfg.num_microbatches``).
    """

    def __init__(self, cfg: "ConfigContainer", backend: "DataParallelBackend", forward_step: ForwardStep,
                 n_microbatches: int) -> None:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        self.chunks = backend.chunks
        self.forward_step = forward_step
        self.n_microbatches = n_microbatches
        self.seq_length = cfg.model.seq_length
        self.micro_batch_size = cfg.train.micro_batch_size
        self.forward_backward = get_forward_backward_func()
        self._scale: float | None = None
        self._loss_sums: list[torch.Tensor] = []
        self._token_counts: list[torch.Tensor] = []
        _configure_grad_sync(self.chunks, cfg.ddp.overlap_grad_reduce)
        m = cfg.model
        log_rank_0(logger, "pipeline (megatron-core): %s over %d stages (%d per rank), %d micro-batches per step, "
                   "batch_p2p_comm=%s, overlap_p2p_comm=%s", self.forward_backward.__name__,
                   m.pipeline_model_parallel_size * len(self.chunks), len(self.chunks), n_microbatches,
                   m.batch_p2p_comm, m.overlap_p2p_comm)

    def _step(self, data_iterator: Iterator[Batch], model: torch.nn.Module) -> tuple[torch.Tensor, Callable]:
        from megatron_bridge.engines.forward_step_forms import forward_step_result

        output, loss_func = forward_step_result(self.forward_step(data_iterator, model), self.forward_step)
        return output, partial(self._loss, loss_func)

    def _loss(self, loss_func: Callable[..., Any], output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """The last stage's loss of one micro-batch, in the form megatron-core back-propagates (module docstring)."""
        from megatron_bridge.engines.forward_step_forms import loss_func_result

        loss_sum, tokens, report = loss_func_result(loss_func(output), loss_func)
        self._loss_sums.append(loss_sum.detach().clone())  # megatron-core divides the returned loss in place
        self._token_counts.append(tokens.detach().clone())
        if self._scale is None:  # megatron-core sums the token counts as int
            return loss_sum, tokens.detach().round().to(torch.int), report
        one = torch.ones((), dtype=torch.int, device=tokens.device)
        return loss_sum * (self._scale * self.n_microbatches), one, report

    def run(self, batches: list[Batch], *, scale: float | None, train: bool) -> tuple[float, float]:
        """One step (``train``: forward and backward; else forward only) over ``batches``, the step's micro-batches.

        Returns this rank's (loss sum, token count): the last stage's, zeros on the other stages.
        """
        self._scale, self._loss_sums, self._token_counts = scale, [], []
        iterators: Any = [iter(batches) for _ in self.chunks]
        self.forward_backward(
            forward_step_func=self._step,
            data_iterator=iterators if len(iterators) > 1 else iterators[0],
            model=self.chunks,
            num_microbatches=len(batches),
            seq_length=self.seq_length,
            micro_batch_size=self.micro_batch_size,
            forward_only=not train,
        )
        if not self._loss_sums:
            return 0.0, 0.0
        return (float(torch.stack(self._loss_sums).double().sum()),
                float(torch.stack(self._token_counts).double().sum()))


def _configure_grad_sync(chunks: list[torch.nn.Module], overlap_grad_reduce: bool) -> None:
    """Hand the chunks' gradient-sync hooks to megatron-core's schedule (through the shared ``TransformerConfig``)."""
    config = chunks[0].config
    no_sync = [chunk.no_sync for chunk in chunks]
    config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
    if overlap_grad_reduce:
        grad_sync = [chunk.start_grad_sync for chunk in chunks]
        config.grad_sync_func = grad_sync[0] if len(grad_sync) == 1 else grad_sync
    config.finalize_model_grads_func = None  # the loop finalizes (backend.finish_grad_sync)
