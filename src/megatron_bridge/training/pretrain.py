"""``pretrain(config, forward_step_func, callbacks)`` (Megatron-Bridge's signature): validate → set up → train →
tear down.

Set-up order: process groups → seeds → model chunks (meta device when asked) → modelopt quantizers (restored or
calibrated, ``cfg.quantization``) → torchao FP8 Linear layers (FP8 presets) → ``ddp_wrap`` → distillation teacher
(``cfg.distillation``) → optimizer (sharded by the backend when it does that) → LR schedule → checkpoint load → data
loaders (resumed at the loaded position).
"""

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from megatron_bridge.checkpoint.train_state import TrainState
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.engines.base import Engine, PipelineRunner
from megatron_bridge.engines.factory import get_engine
from megatron_bridge.engines.forward_step_forms import check_forward_step_signature, prepare_forward_step_func
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.training.callbacks import Callback, CallbackManager, fire_event, normalize_callbacks
from megatron_bridge.training.exits import ExitConditions, stop_requested_on_any_rank
from megatron_bridge.training.gpt_step import forward_step as default_forward_step
from megatron_bridge.training.loop import TrainResult, run_training
from megatron_bridge.training.lr_schedule import OptimizerParamScheduler
from megatron_bridge.training.metrics import TrainingLogger
from megatron_bridge.training.profiling import StepProfiler
from megatron_bridge.training.timers import PhaseTimers
from megatron_bridge.utils.logging import get_logger, log_rank_0, setup_logging


logger = get_logger(__name__)


@dataclass
class TrainingContext:
    """Everything the loop needs; also the ``state`` argument of forward steps that take it
    (:mod:`megatron_bridge.engines.forward_step_forms`)."""

    cfg: ConfigContainer
    env: Any
    backend: Any
    optimizer: torch.optim.Optimizer
    scheduler: OptimizerParamScheduler
    train_state: TrainState
    checkpoint: Any
    loaded_checkpoint: bool
    metrics: TrainingLogger
    exits: ExitConditions
    grad_scaler: Any
    """fp16 loss scaler (``torch.amp.GradScaler``, or megatron-core's through ``MegatronCoreLossScaler``); None
    otherwise."""
    result: TrainResult
    dp_size: int
    callbacks: CallbackManager | None
    static_tokens_per_step: int | None
    profiler: StepProfiler
    loaders: Any = None
    """The data loaders (built after ``on_data_init_start``)."""
    train_iter: Iterator[dict[str, torch.Tensor]] | None = None
    valid_iter: Iterator[dict[str, torch.Tensor]] | None = None
    cp_size: int = 1
    """Context-parallel size: each sample's tokens are spread over this many ranks."""
    pipeline: PipelineRunner | None = None
    """The engine's pipeline schedule under pipeline parallelism (:meth:`Engine.pipeline_runner`), else None."""
    moe: Any = None
    """Bookkeeping of the MoE layers (the engine's :meth:`~megatron_bridge.engines.base.Engine.moe_tracker`), None
    for dense models."""
    mtp: Any = None
    """Bookkeeping of multi-token prediction (the engine's :meth:`~megatron_bridge.engines.base.Engine.mtp_tracker`),
    None without it."""
    distiller: Any = None
    """The distillation teacher and losses (megatron_bridge.optimization.distillation.Distiller), None without."""
    fp8: Any = None
    """FP8 training state (megatron_bridge.models.float8.Float8Training), None without an FP8 preset."""

    @property
    def device(self) -> torch.device:
        """The device this rank computes on."""
        return self.env.device

    @property
    def timers(self) -> PhaseTimers:
        """The phase timers (Megatron-Bridge's ``state.timers``): ``with state.timers("batch-generator"): ...`` or
        ``state.timers("batch-generator", log_level=2).start()`` ... ``.stop()``."""
        return self.metrics.timers

    @property
    def model(self) -> nn.Module | list[nn.Module]:
        """The wrapped model (a list when there are several chunks)."""
        chunks = self.backend.chunks
        return chunks[0] if len(chunks) == 1 else chunks


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _build_tokenizer_and_check_vocab(cfg: ConfigContainer) -> Any:
    from megatron_bridge.data.tokenizers import build_tokenizer

    tokenizer = build_tokenizer(cfg.tokenizer)
    if tokenizer.vocab_size > cfg.model.vocab_size:
        raise ConfigValidationError(
            f"the tokenizer has {tokenizer.vocab_size} ids but model.vocab_size={cfg.model.vocab_size}: set "
            f"model.vocab_size={tokenizer.vocab_size} (or larger)", ("model.vocab_size", "tokenizer.tokenizer_type")
        )
    return tokenizer


def _build_data(cfg: ConfigContainer, tokenizer: Any, state: TrainState, dp_rank: int, dp_size: int,
                cp_rank: int) -> Any:
    from megatron_bridge.config.rules import run_samples
    from megatron_bridge.data.loaders import build_pretraining_data_loaders

    train_samples, valid_samples = run_samples(cfg)  # rule run_length_fits checked they fit
    return build_pretraining_data_loaders(
        cfg.dataset, tokenizer, micro_batch_size=cfg.train.micro_batch_size,
        train_samples=train_samples, valid_samples=valid_samples, test_samples=0,
        data_parallel_rank=dp_rank, data_parallel_size=dp_size,
        consumed_train_samples=state.consumed_train_samples, consumed_valid_samples=state.consumed_valid_samples,
        context_parallel_size=cfg.model.context_parallel_size, context_parallel_rank=cp_rank,
    )


def _checkpoint_manager(cfg: ConfigContainer, engine: Engine, backend: Any, optimizer: Any, scheduler: Any,
                        state: TrainState) -> Any:
    c = cfg.checkpoint
    if not (c.save or c.load or c.pretrained_checkpoint):
        return None
    from megatron_bridge.bridge.converter import PretrainedConverter
    from megatron_bridge.checkpoint import CheckpointManager

    extra_files = None
    if cfg.quantization.quant_cfg is not None:
        from megatron_bridge.optimization.state import MODELOPT_STATE_FILENAME, modelopt_state_bytes

        def extra_files() -> dict[str, bytes]:
            return {MODELOPT_STATE_FILENAME: modelopt_state_bytes(backend.unwrap(backend.chunks[0]))}

    return CheckpointManager(cfg, backend, optimizer, scheduler, state, extra_files=extra_files,
                             converter=PretrainedConverter(), engine=engine)


def _quantize(cfg: ConfigContainer, chunks: list[nn.Module], tokenizer: Any, device: torch.device) -> list[nn.Module]:
    """QAT: quantizers inserted (or restored) into the plain model before it is wrapped (cfg.quantization)."""
    from megatron_bridge.distributed.common import has_meta_params
    from megatron_bridge.models.provider import materialize_meta_model
    from megatron_bridge.optimization.quantization import prepare_quantized_model

    if has_meta_params(chunks):  # calibration needs real weights: materialize the whole model first
        log_rank_0(logger, "quantization: materializing the meta-device model on every rank before calibration")
        chunks = [materialize_meta_model(chunk, device) for chunk in chunks]
    return [prepare_quantized_model(cfg, chunk, tokenizer, device) for chunk in chunks]


def setup(cfg: ConfigContainer, env: Any, callbacks: list[Callback] | CallbackManager | None = None,
          forward_step_func: Callable[..., Any] | None = None) -> TrainingContext:
    """Build model, backend, optimizer, schedule, checkpoint manager and data for a validated config.

    ``forward_step_func`` is the step the engine's pipeline schedule runs under PP > 1 (megatron-core's schedules run
    it; the native one computes the default loss itself); default: the engine's :meth:`Engine.default_forward_step`.
    The loop calls it itself without PP. Fires ``on_data_init_start`` before the data loaders are built."""
    from megatron_bridge.distributed.context_parallel import context_parallel_rank
    from megatron_bridge.distributed.init import data_parallel_rank, pipeline_parallel_rank
    from megatron_bridge.engines.ddp_wrap import ddp_wrap
    from megatron_bridge.models.float8 import convert_for_fp8_training
    from megatron_bridge.models.flops import num_floating_point_operations

    set_seed(cfg.rng.seed)
    tokenizer = _build_tokenizer_and_check_vocab(cfg)
    pp_rank = pipeline_parallel_rank(cfg, env.rank, env.world_size)
    engine = get_engine(cfg)
    chunks = engine.build_model_chunks(cfg, env.device, pp_rank)
    if cfg.quantization.quant_cfg is not None:
        chunks = _quantize(cfg, chunks, tokenizer, env.device)
    fp8 = convert_for_fp8_training(chunks, cfg)
    backend = ddp_wrap(chunks, cfg, env.device)
    distiller = _distiller(cfg, backend, env.device) if cfg.distillation.enabled else None
    optimizer = backend.prepare_optimizer(engine.build_optimizer(cfg, backend.chunks, env.device))
    scheduler = OptimizerParamScheduler(optimizer, cfg)
    state = TrainState()
    checkpoint = _checkpoint_manager(cfg, engine, backend, optimizer, scheduler, state)
    loaded = checkpoint.load() if checkpoint is not None else False
    if loaded and state.step > cfg.train_iters:
        raise ConfigValidationError(
            f"the checkpoint loaded from checkpoint.load={cfg.checkpoint.load!r} is at step {state.step}, beyond "
            f"train.train_iters={cfg.train_iters}: set train.train_iters >= {state.step} to train on from it, or "
            "load an earlier step with checkpoint.ckpt_step", ("train.train_iters", "checkpoint.load"),
        )
    dp_size = cfg.data_parallel_size(env.world_size)
    dp_rank = data_parallel_rank(cfg, env.rank, env.world_size)  # TP and CP ranks of one group read the same samples
    cp_rank = context_parallel_rank(cfg, env.rank)  # ... and CP ranks keep their zig-zag slice
    seq = cfg.model.seq_length
    result = TrainResult(tokens_per_step=cfg.train.global_batch_size * seq, world_size=env.world_size,
                         backend=backend.name,
                         flops_per_step=num_floating_point_operations(cfg.model, cfg.train.global_batch_size, seq))
    ctx = TrainingContext(
        cfg=cfg, env=env, backend=backend, optimizer=optimizer, scheduler=scheduler, train_state=state,
        checkpoint=checkpoint, loaded_checkpoint=loaded, metrics=TrainingLogger(cfg, env.device, env.world_size),
        exits=ExitConditions(cfg, env.device),
        grad_scaler=engine.grad_scaler(cfg, env.device, optimizer), result=result, dp_size=dp_size,
        callbacks=normalize_callbacks(callbacks),
        static_tokens_per_step=None if cfg.dataset.eod_mask_loss else cfg.train.global_batch_size * seq,
        profiler=StepProfiler(cfg, env.rank, env.device), cp_size=cfg.model.context_parallel_size,
        moe=engine.moe_tracker(cfg, [backend.unwrap(c) for c in backend.chunks], env.device, env.world_size),
        mtp=engine.mtp_tracker(cfg, [backend.unwrap(c) for c in backend.chunks], env.device),
        distiller=distiller, fp8=fp8,
    )
    ctx.pipeline = _pipeline_runner(engine, ctx, forward_step_func)
    fire_event(ctx, "on_data_init_start", optimizer=optimizer, scheduler=scheduler)
    _attach_data(ctx, _build_data(cfg, tokenizer, state, dp_rank, dp_size, cp_rank))
    return ctx


def _attach_data(ctx: TrainingContext, loaders: Any) -> None:
    from megatron_bridge.data.loaders import cyclic_iter

    ctx.loaders, ctx.train_iter = loaders, iter(loaders.train)
    ctx.valid_iter = cyclic_iter(loaders.valid) if loaders.valid is not None else None


def _pipeline_runner(engine: Engine, ctx: TrainingContext,
                     forward_step_func: Callable[..., Any] | None) -> PipelineRunner | None:
    """The engine's pipeline schedule (PP > 1); a forward step that takes the state gets ``ctx``."""
    step = prepare_forward_step_func(forward_step_func or engine.default_forward_step(), ctx)
    n_micro = ctx.cfg.num_microbatches(ctx.env.world_size)
    return engine.pipeline_runner(ctx.cfg, ctx.backend, ctx.env.device, n_micro, step)


def _distiller(cfg: ConfigContainer, backend: Any, device: torch.device) -> Any:
    """Knowledge distillation: the frozen teacher (replicated) and the losses (cfg.distillation)."""
    from megatron_bridge.optimization.distillation import Distiller, build_teacher

    return Distiller(cfg, build_teacher(cfg, device), backend.unwrap(backend.chunks[0]))


def pretrain(
    config: ConfigContainer,
    forward_step_func: Callable[..., Any] = default_forward_step,
    callbacks: list[Callback] | CallbackManager | None = None,
) -> TrainResult:
    """Validate ``config`` and train; returns a :class:`TrainResult` on every rank.

    Megatron-Bridge's signature and keyword names (``pretrain(config=..., forward_step_func=..., callbacks=...)``;
    ``callbacks`` a list of :class:`Callback` or a :class:`CallbackManager`, docs/training/callbacks.md);
    ``forward_step_func`` defaults to the engine's GPT step and may take any of Megatron-Bridge's forms
    (``(data_iterator, model)``, ``(data_iterator, model, return_schedule_plan=False)``, ``(state, data_iterator,
    model)``, ``(state, data_iterator, model, return_schedule_plan=False)``), called as Megatron-Bridge calls them
    (:mod:`megatron_bridge.engines.forward_step_forms`); a step no form fits is refused before anything is built.

    Works in a plain process (a 1-rank group is created) and under ``torchrun`` (gloo on CPU, nccl on CUDA unless
    ``dist.distributed_backend`` says otherwise). Process groups this call created are destroyed on return; a script
    may call it again (also under torchrun).

    When anything raises on a rank, that rank aborts the process groups (no barrier, pending async saves are
    abandoned) and re-raises, so the other ranks' collectives fail at once and the whole job stops within seconds;
    see docs/troubleshooting.md.
    With ``config.distillation`` the default forward step is replaced by the distillation one; a custom forward step
    that takes the state finds the teacher and the losses in ``state.distiller``.

    Raises:
        ConfigValidationError: ``config`` fails ``validate()``, or the engine refuses the forward step with it.
        ForwardStepError: ``forward_step_func`` fits none of the forms above.
        CallbackError: ``callbacks`` holds something that is no callback, or a method named ``on_...`` that is no
            event (docs/training/callbacks.md).
    """
    from megatron_bridge.distributed.failure import abort_distributed, annotate_failure
    from megatron_bridge.distributed.init import destroy_distributed, hold_groups, initialize_distributed
    from megatron_bridge.training.determinism import apply_deterministic_mode
    from megatron_bridge.training.job import agree_on_job, forbid_restart_after
    from megatron_bridge.utils.process import watch_parent

    cfg = config
    setup_logging(cfg.logger.logging_level)
    cfg.validate()
    check_forward_step_signature(forward_step_func)
    callbacks = normalize_callbacks(callbacks)  # a misspelled event is refused before anything is built
    engine = get_engine(cfg)
    engine.check_forward_step(cfg, forward_step_func)
    if forward_step_func is default_forward_step:
        forward_step_func = engine.default_forward_step()
    if cfg.distillation.enabled and forward_step_func is default_forward_step:
        from megatron_bridge.optimization.distillation import distillation_forward_step

        forward_step_func = distillation_forward_step
    apply_deterministic_mode(cfg.model.deterministic_mode)  # before the process groups: NCCL reads NCCL_ALGO
    env = initialize_distributed(cfg)
    watch_parent()  # under a launcher (torchrun): exit when it dies instead of training on as an orphan
    ctx: TrainingContext | None = None
    try:
        attempt = agree_on_job(cfg)  # every node runs the same config; a restarted attempt resumes its checkpoints
        if stop_requested_on_any_rank(cfg, env.device):  # a stop signal during start-up: build nothing, save nothing
            log_rank_0(logger, "a stop signal came during start-up: stopping before the model is built, with nothing "
                       "new to save")
            result = TrainResult(world_size=env.world_size, exit_reason="signal")
        else:
            ctx = setup(cfg, env, callbacks, forward_step_func)
            result = _train(ctx, attempt, forward_step_func)
    except BaseException as exc:
        # Fail fast: no barrier, no wait for pending saves; aborting the groups makes the peers' collectives fail
        # at once instead of after the collective timeout.
        annotate_failure(exc, env.rank, env.world_size)
        forbid_restart_after(exc)  # before the abort: the other nodes' agents must see it when their ranks fail
        hold_groups()  # the aborted groups go at the next start, not with this traceback
        abort_distributed()
        try:
            _close(ctx, failed=True)
        except Exception as close_exc:  # the original error is the one to show, not the teardown's
            logger.debug("teardown after a failure raised %r", close_exc)
        destroy_distributed(teardown=engine.destroy_groups)
        raise
    _close(ctx, failed=False)
    destroy_distributed(teardown=engine.destroy_groups)
    return result


def _train(ctx: TrainingContext, attempt: int, forward_step_func: Callable[..., Any]) -> TrainResult:
    cfg, env = ctx.cfg, ctx.env
    from megatron_bridge.training.job import log_resume

    log_resume(attempt, ctx.train_state.step, ctx.loaded_checkpoint)
    if cfg.logger.save_config_filepath and env.rank == 0:  # after set-up: a refused run writes nothing
        cfg.to_yaml(cfg.logger.save_config_filepath)
    n_params = sum(p.numel() for chunk in ctx.backend.chunks for p in chunk.parameters())
    log_rank_0(logger, "training %.2fM parameters for %d steps on %d rank(s) with %s (%d micro-batches/step)",
               n_params / 1e6, cfg.train_iters, env.world_size, ctx.backend.name, cfg.num_microbatches(env.world_size))
    return run_training(ctx, prepare_forward_step_func(forward_step_func, ctx))


def _close(ctx: TrainingContext | None, failed: bool) -> None:
    """Release what ``setup`` opened; after a failure, pending checkpoint saves are abandoned, not awaited."""
    if ctx is None:
        return
    try:
        if ctx.checkpoint is not None:
            if failed:
                ctx.checkpoint.abandon()
            else:
                ctx.checkpoint.close()
    finally:
        ctx.profiler.close()
        ctx.metrics.close()
        ctx.exits.close()
