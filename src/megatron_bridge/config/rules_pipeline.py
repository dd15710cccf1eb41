"""Validation rules of pipeline parallelism: the layer split, the schedule, and what composes with PP > 1.

What composes is measured (``shared/reference/engine-feasibility.md``): FSDP2 must not reshard after forward under the
zero-bubble schedules; classic DDP only runs single-stage schedules (the DDP backend switches to torch's FSDP-based
``replicate`` for multi-stage ones). The table is in docs/training/pipeline-parallel.md.
"""

from typing import TYPE_CHECKING

from megatron_bridge.config.model import (
    SCHEDULES,
    SINGLE_STAGE_SCHEDULES,
    SPLIT_BACKWARD_SCHEDULES,
    V_SCHEDULES,
    resolve_schedule,
)
from megatron_bridge.config.pipeline_layout import PipelineLayoutError, stage_layer_counts
from megatron_bridge.config.rule_registry import fail, positive, rule
from megatron_bridge.config.rules import layout_sizes_ok


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

_PP = "model.pipeline_model_parallel_size"
_VP = "model.virtual_pipeline_model_parallel_size"
_SCHED = "model.pipeline_schedule"
_LAYOUT = "model.pipeline_model_parallel_layout"


def _pp(cfg: "ConfigContainer") -> int:
    return cfg.model.pipeline_model_parallel_size


@rule("pipeline_layers", ("model.num_layers", _PP, _VP, "model.num_layers_in_first_pipeline_stage",
                          "model.num_layers_in_last_pipeline_stage", "model.account_for_embedding_in_pipeline_split",
                          "model.account_for_loss_in_pipeline_split"),
      "The decoder layers split over PP×VP stages: evenly, or as num_layers_in_first/last_pipeline_stage or "
      "account_for_embedding/loss_in_pipeline_split say; virtual stages need PP > 1.")
def _pipeline_layers(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    vp = m.virtual_pipeline_model_parallel_size
    if vp is not None and m.pipeline_model_parallel_size <= 1:
        fail(f"{_VP}={vp} needs {_PP} > 1 (got {m.pipeline_model_parallel_size}); set it to None", _VP)
        return
    if m.pipeline_model_parallel_size < 1 or (vp is not None and vp < 1) or m.num_layers < 1:
        return  # positive_sizes reports it
    if m.pipeline_model_parallel_layout is not None:
        return  # pipeline_layout checks it
    try:
        stage_layer_counts(m)
    except PipelineLayoutError as exc:
        fail(str(exc), *exc.paths)


@rule("pipeline_layout", (_LAYOUT, "model.num_layers", _PP, _VP, "model.num_layers_in_first_pipeline_stage",
                          "model.account_for_embedding_in_pipeline_split"),
      "model.pipeline_model_parallel_layout (string or list of lists) has PP×VP stages, num_layers decoder layers, "
      "one embedding first in stage 0 and one loss last in the last stage, no MTP (none here), no empty stage on the "
      "native engine; not with num_layers_in_first/last_pipeline_stage or account_for_*_in_pipeline_split.")
def _pipeline_layout(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    vp = m.virtual_pipeline_model_parallel_size
    if m.pipeline_model_parallel_layout is None or not positive(m.pipeline_model_parallel_size, m.num_layers):
        return
    if vp is not None and (not positive(vp) or m.pipeline_model_parallel_size <= 1):
        return  # positive_sizes / pipeline_layers name it
    try:
        stage_layer_counts(m)
    except PipelineLayoutError as exc:
        fail(str(exc), *exc.paths)


@rule("pipeline_schedule", (_SCHED, _PP, _VP, "train.global_batch_size"),
      "model.pipeline_schedule needs PP > 1; 1F1B has no virtual stages and micro-batches >= PP; the interleaved "
      "schedules need virtual stages and micro-batches divisible into rounds of PP; ZBVZeroBubble and DualPipeV need "
      "VP = 2; DualPipeV needs micro-batches >= PP×VP.")
def _pipeline_schedule(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    pp, vp = m.pipeline_model_parallel_size, m.virtual_pipeline_model_parallel_size
    if m.pipeline_schedule is not None and m.pipeline_schedule not in SCHEDULES:
        fail(f"{_SCHED}={m.pipeline_schedule!r} is not a schedule; use one of {list(SCHEDULES)} or None", _SCHED)
        return
    if not positive(pp) or (vp is not None and not positive(vp)):
        return  # positive_sizes names them
    if pp <= 1:
        if m.pipeline_schedule is not None:
            fail(f"{_SCHED}={m.pipeline_schedule!r} needs {_PP} > 1 (got {pp}): set it to None", _SCHED, _PP)
        return
    schedule = resolve_schedule(m)
    if schedule in SINGLE_STAGE_SCHEDULES and vp is not None:
        fail(f"{_SCHED}={schedule!r} runs one stage per rank, but {_VP}={vp}: use 'Interleaved1F1B' (or another "
             "multi-stage schedule) or set the virtual size to None", _SCHED, _VP)
    if schedule not in SINGLE_STAGE_SCHEDULES and vp is None:
        fail(f"{_SCHED}={schedule!r} runs several stages per rank and needs {_VP} (2 or more): set it, or use '1F1B'",
             _SCHED, _VP)
    if schedule in V_SCHEDULES and vp is not None and vp != 2:
        fail(f"{_SCHED}={schedule!r} places exactly 2 stages per rank (V shape) and needs {_VP}=2 (got {vp})",
             _SCHED, _VP)
    if not (layout_sizes_ok(cfg, world_size) and positive(cfg.train.micro_batch_size, cfg.train.global_batch_size)):
        return  # positive_sizes and world_size_divisible name them
    _check_microbatches(cfg, schedule, cfg.num_microbatches(world_size), pp * (vp or 1))


def _check_microbatches(cfg: "ConfigContainer", schedule: str, n_micro: int, n_stages: int) -> None:
    pp = cfg.model.pipeline_model_parallel_size
    where = (f"{n_micro} micro-batches per step (train.global_batch_size / (train.micro_batch_size × data-parallel "
             "size))")
    if schedule == "1F1B" and n_micro < pp:
        fail(f"{_SCHED}='1F1B' needs at least PP={pp} micro-batches, got {where}: raise train.global_batch_size",
             "train.global_batch_size", _PP)
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, n_micro // pp)
        if n_micro % rounds:
            fail(f"{_SCHED}={schedule!r} runs micro-batches in rounds of PP={pp}: {where} is not a multiple of "
                 f"{rounds} rounds; use a multiple of {pp} micro-batches", "train.global_batch_size", _SCHED)
    if schedule == "DualPipeV" and n_micro < n_stages:
        fail(f"{_SCHED}='DualPipeV' needs at least PP×VP={n_stages} micro-batches, got {where}: raise "
             "train.global_batch_size", "train.global_batch_size", _SCHED)


@rule("pipeline_fsdp2_reshard", ("fsdp2.reshard_after_forward", _SCHED, "dist.use_torch_fsdp2"),
      "FSDP2 under the zero-bubble schedules keeps parameters unsharded after forward: "
      "fsdp2.reshard_after_forward=True is refused there (None means False under PP).")
def _fsdp2_reshard(cfg: "ConfigContainer", world_size: int) -> None:
    if not (cfg.dist.use_torch_fsdp2 and _pp(cfg) > 1 and cfg.fsdp2.reshard_after_forward is True):
        return
    schedule = resolve_schedule(cfg.model)
    if schedule in SPLIT_BACKWARD_SCHEDULES:
        fail(f"fsdp2.reshard_after_forward=True is silently wrong under {_SCHED}={schedule!r} (the weight-gradient "
             "pass runs after FSDP2 resharded; pytorch/pytorch#164756): set it to None or False",
             "fsdp2.reshard_after_forward", _SCHED)


@rule("pipeline_megatron_fsdp", ("dist.use_megatron_fsdp", _PP),
      "Megatron FSDP is not combined with pipeline parallelism in this version.")
def _megatron_fsdp(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.dist.use_megatron_fsdp and _pp(cfg) > 1:
        fail(f"dist.use_megatron_fsdp=True does not support {_PP} > 1 (got {_pp(cfg)}) in this version: use "
             "dist.use_torch_fsdp2=True (FSDP2) or DDP with pipeline parallelism", "dist.use_megatron_fsdp", _PP)


@rule("pipeline_tied_embeddings", ("model.share_embeddings_and_output_weights", _PP, _SCHED, "model.engine"),
      "Tied input/output embeddings under PP keep a copy on the last stage (native engine), not with the V "
      "schedules (ZBVZeroBubble, DualPipeV), which put the first and last stage on one rank.")
def _tied(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.model.engine == "megatron_core":  # megatron-core keeps a copy on the last stage, synced by its grads
        return
    if not (cfg.model.share_embeddings_and_output_weights and _pp(cfg) > 1):
        return
    schedule = resolve_schedule(cfg.model) if cfg.model.pipeline_schedule in (None, *SCHEDULES) else None
    if schedule in V_SCHEDULES:
        fail(f"model.share_embeddings_and_output_weights=True with {_SCHED}={schedule!r}: the V schedule puts the "
             "first and the last stage on one rank, where the native engine does not share the embedding between "
             "the two chunks in this version: use 'Interleaved1F1B' or 'InterleavedZeroBubble' (or '1F1B' without "
             "virtual stages), untie the embeddings, or use model.engine='megatron_core'",
             "model.share_embeddings_and_output_weights", _SCHED)


@rule("pipeline_ckpt_format", ("checkpoint.ckpt_format", _PP),
      "With PP > 1 checkpoints use a DCP format ('torch_dist' or 'fsdp_dtensor'), which every stage writes.")
def _ckpt_format(cfg: "ConfigContainer", world_size: int) -> None:
    c = cfg.checkpoint
    if _pp(cfg) > 1 and c.ckpt_format == "torch" and (c.save or c.load):
        fail(f"checkpoint.ckpt_format='torch' gathers the whole model on rank 0, which holds only its pipeline "
             f"stage with {_PP}={_pp(cfg)}: use 'torch_dist'", "checkpoint.ckpt_format", _PP)


@rule("pipeline_fp16", ("optimizer.fp16", _PP),
      "fp16 loss scaling is not synchronized over pipeline stages: PP > 1 trains in bf16 or fp32.")
def _fp16(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.optimizer.fp16 and _pp(cfg) > 1:
        fail(f"optimizer.fp16=True with {_PP}={_pp(cfg)}: each stage's loss scaler would skip steps on its own; use "
             "mixed_precision='bf16_mixed' or 'fp32'", "optimizer.fp16", _PP)
