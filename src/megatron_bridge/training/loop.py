"""The training step, the evaluation pass and the loop around them.

Loss and gradient normalisation: every micro-batch's ``loss_func`` returns the *sum* of its masked token losses and
its token count. Before the forward passes of a step, the step's token count over all micro-batches and
data-parallel ranks (``global_tokens``) is known from the batches' ``loss_mask`` (one all-reduce, or none when nothing
is masked: ``dataset.eod_mask_loss=False``); each micro-batch back-propagates
``loss_sum * dp_size * cp_size / global_tokens``. The backends average gradients over the ``dp_size × cp_size`` ranks
(with context parallelism every rank holds a zig-zag slice of its samples' tokens, and the local ``loss_sum`` covers
only those), so the gradient is exactly that of the token-weighted mean loss of the whole global batch — the same as
one process running the whole batch (the functional tests check this). Under pipeline parallelism a
:class:`~megatron_bridge.distributed.pipeline.PipelineRunner` runs the micro-batches through the schedule with the
same scaling; the loss and token counts come from the last stage.
"""

import gc
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from megatron_bridge.engines.forward_step_forms import forward_step_result, loss_func_result
from megatron_bridge.errors import TrainingError
from megatron_bridge.training.callbacks import fire_event, should_fire
from megatron_bridge.training.metrics import StepMetrics
from megatron_bridge.training.tensorboard import peak_memory_bytes
from megatron_bridge.training.timers import Timer
from megatron_bridge.utils.logging import get_logger, log_rank_0


logger = get_logger(__name__)


@dataclass
class TrainResult:
    """What a ``pretrain`` call did (returned on every rank)."""

    losses: list[float] = field(default_factory=list)
    """Global token-weighted training loss of each step run by this call."""
    steps: list[int] = field(default_factory=list)
    """Step number of each entry of ``losses``."""
    step_times: list[float] = field(default_factory=list)
    """Wall-clock seconds of each step."""
    grad_norms: list[float] = field(default_factory=list)
    """Gradient norm (before clipping) of each step."""
    learning_rates: list[float] = field(default_factory=list)
    """Learning rate used by each step."""
    eval_losses: dict[int, float] = field(default_factory=dict)
    """Validation loss by step."""
    exit_reason: str = ""
    """Why the loop stopped: train_iters, exit_interval, duration or signal."""
    final_step: int = 0
    """Step count at exit (including steps restored from a checkpoint)."""
    tokens_per_step: int = 0
    """Tokens in one global batch."""
    flops_per_step: float = 0.0
    """Model FLOPs of one step (forward + backward)."""
    world_size: int = 1
    """Number of processes."""
    backend: str = ""
    """Data-parallel backend name."""
    peak_memory_bytes: int = 0
    """Peak memory of this rank (CUDA allocator peak, or peak RSS on CPU)."""
    reported_losses: dict[str, list[float]] = field(default_factory=dict)
    """Per step, the global token-weighted value of every loss the forward step reports besides the objective
    (e.g. "lm loss" and "logits distillation loss" with distillation); empty when it reports only "lm loss"."""
    mtp_losses: dict[str, list[float]] = field(default_factory=dict)
    """Per step, each multi-token prediction depth's loss (``"mtp_1 loss"``, ...); empty without MTP."""

    @property
    def final_loss(self) -> float:
        """Loss of the last step run (NaN if none ran)."""
        return self.losses[-1] if self.losses else math.nan


def _global_sum(values: list[float], device: torch.device) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor.tolist()


def _count_tokens(batches: list[dict[str, torch.Tensor]]) -> float | None:
    if not all("loss_mask" in b for b in batches):
        return None
    return float(sum(b["loss_mask"].sum().item() for b in batches))


def _global_tokens(ctx: Any, batches: list[dict[str, torch.Tensor]]) -> float | None:
    """Loss tokens of the whole global batch (None when batches carry no ``loss_mask``).

    With ``dataset.eod_mask_loss=False`` the library's datasets mask nothing, so the count is known without
    communication (``ctx.static_tokens_per_step``); the local count is still checked against it.
    """
    local_tokens = _count_tokens(batches)
    if local_tokens is None:
        return None
    if ctx.static_tokens_per_step is not None:
        expected = sum(b["loss_mask"].numel() for b in batches)
        if local_tokens != expected:
            raise TrainingError(
                f"batches mask {expected - local_tokens:.0f} of {expected} loss tokens although "
                "dataset.eod_mask_loss=False: the data pipeline changed the loss mask"
            )
        return float(ctx.static_tokens_per_step)
    model_copies = ctx.env.world_size / (ctx.dp_size * ctx.cp_size)  # ranks holding the same tokens (TP)
    return _global_sum([local_tokens], ctx.device)[0] / model_copies


def _add_report(sums: dict[str, list[float]], report: dict[str, torch.Tensor]) -> None:
    """Accumulate a loss function's ``{name: [loss_sum, tokens]}`` report (only when it has more than "lm loss")."""
    if set(report) == {"lm loss"}:
        return
    for name, value in report.items():
        loss_sum, tokens = (float(v) for v in value.detach().reshape(-1)[:2])
        acc = sums.setdefault(name, [0.0, 0.0])
        acc[0] += loss_sum
        acc[1] += tokens


def _accumulate(ctx: Any, forward_step_func: Callable[..., Any], batches: list[dict[str, torch.Tensor]],
                global_tokens: float | None) -> tuple[float, float, dict[str, list[float]]]:
    """Forward and backward of every micro-batch (no pipeline); returns this rank's (loss sum, token count) and the
    summed report entries (see :func:`_add_report`)."""
    backend, n_micro, timers = ctx.backend, len(batches), ctx.metrics.timers
    loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
    token_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
    report_sums: dict[str, list[float]] = {}
    for i, batch in enumerate(batches):
        with backend.grad_sync_context(is_last_microbatch=i == n_micro - 1):
            with timers("forward-compute"), backend.forward_context():
                output, loss_func = forward_step_result(forward_step_func(iter([batch]), ctx.model), forward_step_func)
                micro_loss, micro_tokens, report = loss_func_result(loss_func(output), loss_func)
            _add_report(report_sums, report)
            if global_tokens is not None:
                scaled = micro_loss * (ctx.dp_size * ctx.cp_size / global_tokens)
            else:  # no loss_mask in the batch: mean per micro-batch, averaged over micro-batches
                scaled = micro_loss / micro_tokens.clamp(min=1) / n_micro
            if ctx.grad_scaler is not None:
                scaled = ctx.grad_scaler.scale(scaled)
            with timers("backward-compute"):
                scaled.backward()
        loss_sum += micro_loss.detach().to(torch.float64)
        token_sum += micro_tokens.detach().to(torch.float64)
    backend.finish_grad_sync()
    return loss_sum.item(), token_sum.item(), report_sums


def _forward_backward(ctx: Any, forward_step_func: Callable[..., Any], batches: list[dict[str, torch.Tensor]],
                      global_tokens: float | None) -> tuple[float, float, dict[str, list[float]]]:
    """Every micro-batch's forward and backward and the gradient reduction: through the pipeline schedule or
    :func:`_accumulate`; returns this rank's (loss sum, token count, report sums)."""
    if ctx.pipeline is None:
        return _accumulate(ctx, forward_step_func, batches, global_tokens)
    scale = None if global_tokens is None else ctx.dp_size * ctx.cp_size / global_tokens
    local_loss, local_tokens = ctx.pipeline.run(batches, scale=scale, train=True)
    ctx.backend.finish_grad_sync()  # the schedule reduced the backend's gradients; expert-parallel ones here
    return local_loss, local_tokens, {}


def train_step(ctx: Any, forward_step_func: Callable[..., Any]) -> tuple[float, float, dict[str, float]]:
    """One optimizer step over ``num_microbatches`` micro-batches; returns (global loss, grad norm, reported losses).

    Under pipeline parallelism (``ctx.pipeline``) the schedule runs the micro-batches; the loss lives on the last
    stage and the all-reduce over every rank gives each the global loss (other stages add zeros). The reported
    losses are the forward step's report entries besides the objective, token-weighted globally (in the loss's
    all-reduce); empty when it reports only "lm loss".
    """
    backend, cfg, timers = ctx.backend, ctx.cfg, ctx.metrics.timers
    n_micro = cfg.num_microbatches(ctx.env.world_size)
    with timers("batch-generator"):
        batches = [next(ctx.train_iter) for _ in range(n_micro)]
    global_tokens = _global_tokens(ctx, batches)
    if ctx.moe is not None:  # MoE aux-loss gradients: mean over the step's micro-batches
        ctx.moe.begin_step(n_micro, float(ctx.grad_scaler.get_scale()) if ctx.grad_scaler is not None else 1.0)
    if ctx.mtp is not None:  # the MTP loss's gradient: mean over the step's micro-batches, as megatron-core's
        ctx.mtp.begin_step(n_micro, float(ctx.grad_scaler.get_scale()) if ctx.grad_scaler is not None else 1.0)
    backend.zero_grad(ctx.optimizer)
    with timers("forward-backward"):
        local_loss, local_tokens, report_sums = _forward_backward(ctx, forward_step_func, batches, global_tokens)
    if ctx.moe is not None:  # global expert load, expert-bias update, logged statistics
        ctx.moe.end_step()
    if ctx.mtp is not None:  # the depths' losses, logged as "mtp_{k} loss"
        ctx.mtp.end_step()
    flat = [local_loss, local_tokens] + [v for pair in report_sums.values() for v in pair]
    total_loss, total_tokens, *reported = _global_sum(flat, ctx.device)
    loss = total_loss / max(total_tokens, 1.0)
    reported_losses = {name: reported[2 * i] / max(reported[2 * i + 1], 1.0) for i, name in enumerate(report_sums)}
    if not math.isfinite(loss):
        raise TrainingError(
            f"the training loss is {loss} at iteration {ctx.train_state.step + 1}: lower optimizer.lr, check the data, "
            "or use mixed_precision='fp32' / 'bf16_mixed' instead of fp16"
        )
    with timers("optimizer"):
        grad_norm = backend.optimizer_step(ctx.optimizer, cfg.optimizer.clip_grad, ctx.grad_scaler)
        if getattr(ctx, "fp8", None) is not None:  # torchao: FP8 weight scales for the next FSDP2 all-gather
            ctx.fp8.after_optimizer_step(backend.chunks)
    ctx.scheduler.step()
    return loss, grad_norm, reported_losses


def _eval_batch(ctx: Any, forward_step_func: Callable[..., Any], data: Iterator[dict[str, torch.Tensor]],
                n_micro: int) -> tuple[float, float]:
    """This rank's (loss sum, token count) over one global validation batch."""
    if ctx.pipeline is not None:
        return ctx.pipeline.run([next(data) for _ in range(n_micro)], scale=None, train=False)
    loss_sum, token_sum = 0.0, 0.0
    for _ in range(n_micro):
        with ctx.backend.forward_context():
            output, loss_func = forward_step_result(forward_step_func(data, ctx.model), forward_step_func)
            micro_loss, micro_tokens, _ = loss_func_result(loss_func(output), loss_func)
        loss_sum += float(micro_loss)
        token_sum += float(micro_tokens)
    return loss_sum, token_sum


@torch.no_grad()
def evaluate(ctx: Any, forward_step_func: Callable[..., Any], data: Iterator[dict[str, torch.Tensor]]) -> float:
    """Token-weighted loss over ``validation.eval_iters`` global batches (firing the ``on_eval_*`` events)."""
    for chunk in ctx.backend.chunks:
        chunk.eval()
    fire_event(ctx, "on_eval_start")
    loss_sum, token_sum = 0.0, 0.0
    n_micro = ctx.cfg.num_microbatches(ctx.env.world_size)
    for _ in range(ctx.cfg.validation.eval_iters):
        fire_event(ctx, "on_eval_step_start")
        step_loss, step_tokens = _eval_batch(ctx, forward_step_func, data, n_micro)
        loss_sum += step_loss
        token_sum += step_tokens
        fire_event(ctx, "on_eval_step_end")
    total_loss, total_tokens = _global_sum([loss_sum, token_sum], ctx.device)
    loss = total_loss / max(total_tokens, 1.0)
    if should_fire(ctx.callbacks, "on_eval_end"):
        fire_event(ctx, "on_eval_end", total_loss_dict={"lm loss": torch.tensor(loss)})
    for chunk in ctx.backend.chunks:
        chunk.train()
    return loss


def params_norm(backend: Any) -> float:
    """L2 norm of all parameters over all ranks (sharded DTensors are reduced; pipeline stages summed; a tied
    embedding counted once)."""
    params = backend.counted_parameters() if hasattr(backend, "counted_parameters") else backend.parameters()
    norms = [p.detach().float().norm() for p in params]
    local = [n.full_tensor() if hasattr(n, "full_tensor") else n for n in norms]
    squared = torch.linalg.vector_norm(torch.stack(local)).pow(2) if local else torch.zeros((), device=backend.device)
    return float(backend.sum_over_pipeline(squared).sqrt())


def _eval_due(ctx: Any, step: int, stopping: bool) -> bool:
    v = ctx.cfg.validation
    if v.eval_interval is None or v.eval_iters == 0 or ctx.loaders.valid is None:
        return False
    return step % v.eval_interval == 0 or stopping


def run_training(ctx: Any, forward_step_func: Callable[..., Any]) -> TrainResult:
    """Train until an exit condition fires; save checkpoints on schedule and at exit.

    ``forward_step_func`` is called as ``forward_step_func(data_iterator, model)``: a step that takes the state comes
    bound to it (:func:`megatron_bridge.engines.forward_step_forms.prepare_forward_step_func`, as ``pretrain`` does).
    """
    cfg, state = ctx.cfg, ctx.train_state
    result = ctx.result
    timer = Timer(ctx.device)
    if cfg.train.manual_gc:
        gc.disable()
        gc.collect()
    last_saved = state.step if ctx.loaded_checkpoint else -1
    if state.step >= cfg.train_iters:
        reason = ctx.exits.check(state.step)
        log_rank_0(logger, "nothing to train: the run is at step %d and train.train_iters=%d; raise train.train_iters "
                   "to train further", state.step, cfg.train_iters)
    else:
        reason = ctx.exits.check_before_first_step()
        if reason is not None:
            log_rank_0(logger, "a stop signal came before the first step of this job: stopping at step %d with nothing "
                       "new to save", state.step)
    fire_event(ctx, "on_train_start", optimizer=ctx.optimizer, scheduler=ctx.scheduler)
    while reason is None:
        ctx.profiler.step_begin(state.step)
        fire_event(ctx, "on_train_step_start", optimizer=ctx.optimizer, scheduler=ctx.scheduler)
        timer.reset()
        lr = ctx.optimizer.param_groups[0]["lr"]
        loss, grad_norm, reported = train_step(ctx, forward_step_func)
        step_time = timer.elapsed()
        state.step += 1
        state.consumed_train_samples += cfg.train.global_batch_size
        state.floating_point_operations_so_far += result.flops_per_step
        _record(result, state.step, loss, grad_norm, lr, step_time)
        for name, value in reported.items():
            result.reported_losses.setdefault(name, []).append(value)
        for name, value in (ctx.mtp.last.items() if ctx.mtp is not None else ()):
            result.mtp_losses.setdefault(name, []).append(value)
        metrics = StepMetrics(state.step, loss, grad_norm, lr, step_time, result.tokens_per_step,
                              result.flops_per_step, state.consumed_train_samples,
                              params_norm=params_norm(ctx.backend) if cfg.logger.log_params_norm else None,
                              moe_aux_loss=ctx.moe.last.aux_loss if ctx.moe is not None else None,
                              mtp_losses=dict(ctx.mtp.last) if ctx.mtp is not None else {},
                              loss_scale=float(ctx.grad_scaler.get_scale()) if ctx.grad_scaler else 1.0,
                              reported_losses=reported)
        ctx.metrics.log_step(metrics)
        if ctx.moe is not None:
            ctx.metrics.log_moe(state.step, ctx.moe.last)
        if should_fire(ctx.callbacks, "on_train_step_end"):  # no tensors built for nobody
            fire_event(ctx, "on_train_step_end", optimizer=ctx.optimizer, scheduler=ctx.scheduler,
                       loss_dict=_loss_dict(loss, reported), grad_norm=grad_norm,
                       skipped_iter=not math.isfinite(grad_norm), step_metrics=metrics)
        ctx.profiler.step_end(state.step)
        reason = ctx.exits.check(state.step)
        if _eval_due(ctx, state.step, reason is not None):
            result.eval_losses[state.step] = evaluate(ctx, forward_step_func, ctx.valid_iter)
            ctx.metrics.log_eval(state.step, result.eval_losses[state.step])
        if ctx.checkpoint is not None:
            ctx.checkpoint.poll()
            if ctx.checkpoint.should_save(state.step) or (reason is not None and last_saved != state.step):
                ctx.checkpoint.save()
                last_saved = state.step
                fire_event(ctx, "on_checkpoint_save", optimizer=ctx.optimizer)
        if cfg.train.manual_gc and cfg.train.manual_gc_interval and state.step % cfg.train.manual_gc_interval == 0:
            gc.collect()
    if cfg.train.manual_gc:
        gc.enable()
    result.exit_reason = reason
    result.final_step = state.step
    result.peak_memory_bytes = peak_memory_bytes(ctx.device)
    fire_event(ctx, "on_train_end", optimizer=ctx.optimizer, scheduler=ctx.scheduler)
    log_rank_0(logger, "training stopped at step %d (%s)", state.step, reason)
    return result


def _loss_dict(loss: float, reported: dict[str, float]) -> dict[str, torch.Tensor]:
    """Megatron-Bridge's ``loss_dict``: the objective as "lm loss" and every other reported loss, as tensors."""
    return {"lm loss": torch.tensor(loss), **{name: torch.tensor(v) for name, v in reported.items()}}


def _record(result: TrainResult, step: int, loss: float, grad_norm: float, lr: float, step_time: float) -> None:
    result.steps.append(step)
    result.losses.append(loss)
    result.grad_norms.append(grad_norm)
    result.learning_rates.append(lr)
    result.step_times.append(step_time)
