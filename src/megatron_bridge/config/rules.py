"""Cross-field validation rules: one small function each, registered with an id and a one-line summary.

This module holds the basic rules (types, sizes, batch, run length, scheduler). :mod:`.rule_set` registers every rule
module in one explicit order; its ``check_rules`` runs them all and raises one ConfigValidationError listing every
violation: a rule reports each of its violations with :func:`~.rule_registry.fail` and goes on checking (it returns
early only where a later check reads a value an earlier one refused). Rules never divide or allocate by a size before
checking it: :func:`layout_sizes_ok` and :func:`~.rule_registry.positive` tell a rule whether the sizes it reads are
ones rule ``positive_sizes`` accepts. The table of rules in docs/training/config-container.md is checked against
``RULES`` by a test, so the docs cannot drift. Rules about the data-parallel backends and checkpoint formats live in
:mod:`.rules_distributed`, those of pipeline parallelism in :mod:`.rules_pipeline`, those of the FP8/FP4 presets in
:mod:`.rules_precision`, those of quantization and distillation in :mod:`.rules_model_optimization`, those of the
model engine (``model.engine``, ``model.transformer_impl``) in :mod:`.rules_engine`, those about the machine (CUDA,
accelerator) in :mod:`.rules_device`.
"""

from typing import TYPE_CHECKING

from megatron_bridge.config.rule_registry import MAX_SIZE, fail, positive, rule


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer


# ------------------------------------------------------------------------------------------------ field types
@rule("field_types", ("*",),
      "Every field has the type of its annotation (Literal choices, bool/int/float/str, lists, nested configs); "
      "floats are finite (no NaN/Inf).")
def _field_types(cfg: "ConfigContainer", world_size: int) -> None:
    from megatron_bridge.config.typecheck import dataclass_problems

    for path, message in dataclass_problems(cfg):
        fail(message, path)


# ------------------------------------------------------------------------------------------------ basic ranges
_POSITIVE_FIELDS = (
    "train.micro_batch_size",
    "train.global_batch_size",
    "model.num_layers",
    "model.hidden_size",
    "model.ffn_hidden_size",
    "model.num_attention_heads",
    "model.vocab_size",
    "model.make_vocab_size_divisible_by",
    "model.seq_length",
    "model.tensor_model_parallel_size",
    "model.pipeline_model_parallel_size",
    "model.context_parallel_size",
    "model.expert_model_parallel_size",
    "dataset.seq_length",
    "dataset.mock_num_samples",
    "logger.log_interval",
    "logger.tensorboard_log_interval",
    "logger.tensorboard_queue_size",
    "logger.throughput_window_size",
    "dist.distributed_timeout_minutes",
)
_POSITIVE_OR_NONE_FIELDS = (
    "train.train_iters",
    "train.train_samples",
    "train.exit_interval",
    "train.exit_duration_in_mins",
    "validation.eval_interval",
    "checkpoint.save_interval",
    "model.num_query_groups",
    "model.kv_channels",
    "model.virtual_pipeline_model_parallel_size",
    "scheduler.lr_decay_iters",
    "ddp.bucket_size",
    "ddp.bucket_cap_mb",
    "dist.distributed_timeout_seconds",
)


def _get(cfg: "ConfigContainer", path: str) -> object:
    obj: object = cfg
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def layout_sizes_ok(cfg: "ConfigContainer", world_size: int) -> bool:
    """Whether TP, PP and CP are ints > 0 that divide ``world_size``: then ``cfg.data_parallel_size(world_size)``
    and ``cfg.num_microbatches`` are exact (rules ``positive_sizes`` and ``world_size_divisible`` name the rest)."""
    m = cfg.model
    sizes = (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size)
    return positive(world_size, *sizes) and world_size % (sizes[0] * sizes[1] * sizes[2]) == 0


@rule("positive_sizes", _POSITIVE_FIELDS + _POSITIVE_OR_NONE_FIELDS,
      "Sizes, counts and intervals are > 0 (and at most 2**31 - 1, but train.train_samples).")
def _positive(cfg: "ConfigContainer", world_size: int) -> None:
    for path in _POSITIVE_FIELDS + _POSITIVE_OR_NONE_FIELDS:
        value = _get(cfg, path)
        if value is None and path in _POSITIVE_OR_NONE_FIELDS:
            continue
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            fail(f"{path} must be > 0 (got {value!r})", path)
        elif value > MAX_SIZE and path != "train.train_samples":
            fail(f"{path}={value!r} is beyond {MAX_SIZE} (2**31 - 1), the largest size this library builds: use a "
                 "smaller value", path)


@rule("nonnegative_values", ("optimizer.weight_decay", "validation.eval_iters", "optimizer.clip_grad",
                             "dataset.num_workers"),
      "Weight decay, clip_grad, eval_iters, warmup, learning rates and dataset.num_workers are >= 0, and "
      "min_lr <= lr.")
def _nonnegative(cfg: "ConfigContainer", world_size: int) -> None:
    for path in ("optimizer.weight_decay", "optimizer.clip_grad", "optimizer.lr", "optimizer.min_lr",
                 "validation.eval_iters", "scheduler.lr_warmup_iters", "scheduler.lr_warmup_init",
                 "model.init_method_std", "dataset.num_workers"):
        value = _get(cfg, path)
        if value < 0:  # type: ignore[operator]
            fail(f"{path} must be >= 0 (got {value!r})", path)
    if 0 <= cfg.optimizer.lr < cfg.optimizer.min_lr:
        fail(f"optimizer.min_lr ({cfg.optimizer.min_lr}) must be <= optimizer.lr ({cfg.optimizer.lr})",
             "optimizer.min_lr", "optimizer.lr")


# ------------------------------------------------------------------------------------------- parallel layout
@rule("world_size_divisible", ("model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
                               "model.context_parallel_size"),
      "The world size is divisible by TP × PP × CP.")
def _world_size(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if not positive(m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size):
        return  # positive_sizes names them
    model_size = m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size
    if world_size % model_size:
        fail(f"world size {world_size} is not divisible by TP×PP×CP = {m.tensor_model_parallel_size}×"
             f"{m.pipeline_model_parallel_size}×{m.context_parallel_size} = {model_size}: change "
             "model.tensor_model_parallel_size/pipeline_model_parallel_size/context_parallel_size or the number of "
             "processes", "model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
             "model.context_parallel_size")


@rule("global_batch_divisible", ("train.global_batch_size", "train.micro_batch_size"),
      "train.global_batch_size is divisible by train.micro_batch_size × data-parallel size.")
def _global_batch(cfg: "ConfigContainer", world_size: int) -> None:
    mbs, gbs = cfg.train.micro_batch_size, cfg.train.global_batch_size
    if not (layout_sizes_ok(cfg, world_size) and positive(mbs, gbs)):
        return  # positive_sizes and world_size_divisible name them
    dp = cfg.data_parallel_size(world_size)
    if gbs % (mbs * dp):
        fail(f"train.global_batch_size={gbs} is not divisible by train.micro_batch_size × data-parallel size = "
             f"{mbs}×{dp} = {mbs * dp}: use a multiple of {mbs * dp}", "train.global_batch_size",
             "train.micro_batch_size")


@rule("context_parallel_seq_length", ("model.context_parallel_size", "model.seq_length", "model.sequence_parallel",
                                      "model.tensor_model_parallel_size"),
      "With context parallelism (CP > 1), model.seq_length is divisible by 2 × CP (× TP with sequence parallelism).")
def _cp_seq(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    cp, seq = m.context_parallel_size, m.seq_length
    if cp <= 1:
        return
    sp = m.sequence_parallel and m.tensor_model_parallel_size > 1
    multiple = 2 * cp * (m.tensor_model_parallel_size if sp else 1)
    if seq % multiple:
        what = (f"2×model.context_parallel_size×model.tensor_model_parallel_size = 2×{cp}×"
                f"{m.tensor_model_parallel_size} = {multiple} (zig-zag chunks, then sequence-parallel shards)" if sp
                else f"2×model.context_parallel_size = {multiple} (the zig-zag layout cuts it into 2×CP chunks)")
        fail(f"model.seq_length={seq} must be divisible by {what}: use a multiple of {multiple}",
             "model.seq_length", "model.context_parallel_size")


@rule("tensor_parallel_heads", ("model.num_attention_heads", "model.num_query_groups",
                                "model.tensor_model_parallel_size"),
      "Attention heads and query groups are divisible by TP; heads are divisible by query groups.")
def _tp_heads(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    tp = m.tensor_model_parallel_size
    if not positive(m.num_attention_heads, m.num_kv_heads, tp):
        return  # positive_sizes names them
    if m.num_attention_heads % m.num_kv_heads:
        fail(f"model.num_attention_heads={m.num_attention_heads} must be divisible by model.num_query_groups="
             f"{m.num_kv_heads}", "model.num_attention_heads", "model.num_query_groups")
    for path, value in (("model.num_attention_heads", m.num_attention_heads),
                        ("model.num_query_groups", m.num_kv_heads)):
        if tp > 1 and value % tp:
            fail(f"{path}={value} must be divisible by model.tensor_model_parallel_size={tp}", path,
                 "model.tensor_model_parallel_size")


@rule("sequence_parallel_needs_tp", ("model.sequence_parallel", "model.tensor_model_parallel_size"),
      "model.sequence_parallel=True requires model.tensor_model_parallel_size > 1.")
def _sp_tp(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.model.sequence_parallel and cfg.model.tensor_model_parallel_size <= 1:
        fail("model.sequence_parallel=True requires model.tensor_model_parallel_size > 1 (got "
             f"{cfg.model.tensor_model_parallel_size}): set model.sequence_parallel=False or raise TP",
             "model.sequence_parallel", "model.tensor_model_parallel_size")


# ------------------------------------------------------------------------------------------ memory options
@rule("cpu_offloading_pipeline", ("model.cpu_offloading", "model.pipeline_model_parallel_size"),
      "model.cpu_offloading requires model.pipeline_model_parallel_size == 1.")
def _offload_pp(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.model.cpu_offloading and cfg.model.pipeline_model_parallel_size != 1:
        fail("model.cpu_offloading=True is not supported with pipeline parallelism (model.pipeline_model_parallel_"
             f"size={cfg.model.pipeline_model_parallel_size}): set PP=1 or cpu_offloading=False",
             "model.cpu_offloading", "model.pipeline_model_parallel_size")


@rule("cpu_offloading_recompute", ("model.cpu_offloading", "model.recompute_granularity",
                                   "ddp.activation_checkpointing", "fsdp2.activation_checkpointing"),
      "model.cpu_offloading does not work with activation recomputation/checkpointing.")
def _offload_recompute(cfg: "ConfigContainer", world_size: int) -> None:
    if not cfg.model.cpu_offloading:
        return
    for path, value in (("model.recompute_granularity", cfg.model.recompute_granularity),
                        ("ddp.activation_checkpointing", cfg.ddp.activation_checkpointing),
                        ("fsdp2.activation_checkpointing", cfg.fsdp2.activation_checkpointing)):
        if value not in (None, False):
            fail(f"model.cpu_offloading=True does not work with activation recomputation ({path}={value!r}): "
                 "disable one of them", "model.cpu_offloading", path)


@rule("cpu_offloading_num_layers", ("model.cpu_offloading_num_layers", "model.num_layers"),
      "With model.cpu_offloading, 0 <= cpu_offloading_num_layers < num_layers.")
def _offload_layers(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if m.cpu_offloading and not 0 <= m.cpu_offloading_num_layers < m.num_layers:
        fail(f"model.cpu_offloading_num_layers={m.cpu_offloading_num_layers} must satisfy 0 <= n < "
             f"model.num_layers={m.num_layers}", "model.cpu_offloading_num_layers")


@rule("recompute_settings", ("model.recompute_granularity", "model.recompute_method", "model.recompute_num_layers"),
      "model.recompute_method 'block' needs 0 <= recompute_num_layers <= num_layers; method needs granularity 'full'.")
def _recompute(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if m.recompute_method is not None and m.recompute_granularity != "full":
        fail(f"model.recompute_method={m.recompute_method!r} only applies to model.recompute_granularity='full' "
             f"(got {m.recompute_granularity!r})", "model.recompute_method", "model.recompute_granularity")
    if m.recompute_method == "block":
        n = m.recompute_num_layers
        if n is None or not 0 <= n <= m.num_layers:
            fail(f"model.recompute_num_layers={n!r} must be in 0..model.num_layers={m.num_layers} with "
                 "recompute_method='block' (the number of leading blocks recomputed; 0 recomputes none)",
                 "model.recompute_num_layers")


# --------------------------------------------------------------------------------------- training schedule
@rule("train_length", ("train.train_iters", "train.train_samples"),
      "Exactly one of train.train_iters and train.train_samples is set, and it gives at least one step.")
def _train_length(cfg: "ConfigContainer", world_size: int) -> None:
    iters, samples = cfg.train.train_iters, cfg.train.train_samples
    if (iters is None) == (samples is None):
        fail(f"set exactly one of train.train_iters and train.train_samples (got train_iters={iters!r}, "
             f"train_samples={samples!r})", "train.train_iters", "train.train_samples")
    elif samples is not None and samples < cfg.train.global_batch_size:
        fail(f"train.train_samples={samples} is less than one global batch ({cfg.train.global_batch_size})",
             "train.train_samples")


INT64_MAX = 2**63 - 1
"""The largest token offset the data index (int64) and a Python sequence length hold."""


def run_samples(cfg: "ConfigContainer") -> tuple[int, int]:
    """The samples the run reads: (train, valid), as ``pretrain`` asks the data loaders for them (sizes must be
    positive: check with :func:`positive` first)."""
    v, gbs = cfg.validation, cfg.train.global_batch_size
    n_evals = cfg.train_iters // v.eval_interval + 1 if v.eval_interval else 0
    return cfg.train_iters * gbs, n_evals * v.eval_iters * gbs


@rule("run_length_fits", ("train.train_iters", "train.train_samples", "validation.eval_iters",
                          "train.global_batch_size", "dataset.seq_length"),
      "The samples the run reads × (dataset.seq_length + 1) tokens fit in int64 (the data index's offsets).")
def _run_length(cfg: "ConfigContainer", world_size: int) -> None:
    t, v = cfg.train, cfg.validation
    if (not positive(t.global_batch_size, cfg.dataset.seq_length) or cfg.train_iters <= 0 or v.eval_iters < 0
            or (v.eval_interval is not None and not positive(v.eval_interval))):
        return  # positive_sizes, nonnegative_values and train_length name them
    seq = cfg.dataset.seq_length + 1
    train, valid = run_samples(cfg)
    length = "train.train_samples" if t.train_samples is not None else "train.train_iters"
    for what, samples, fix in (("train", train, length), ("validation", valid, f"validation.eval_iters or {length}")):
        if samples * seq > INT64_MAX:
            fail(f"{length}={getattr(t, length.split('.')[1])} reads {samples} {what} samples of dataset.seq_length"
                 f"+1={seq} tokens = {samples * seq} tokens, more than the data index's int64 offsets hold "
                 f"({INT64_MAX}): lower {fix}", length, *(("validation.eval_iters",) if what == "validation" else ()))


@rule("model_dataset_seq_length", ("model.seq_length", "dataset.seq_length"),
      "model.seq_length equals dataset.seq_length.")
def _seq_length(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.model.seq_length != cfg.dataset.seq_length:
        fail(f"model.seq_length={cfg.model.seq_length} differs from dataset.seq_length={cfg.dataset.seq_length}: "
             "set both to the same value", "model.seq_length", "dataset.seq_length")


@rule("scheduler_warmup_exclusive", ("scheduler.lr_warmup_fraction", "scheduler.lr_warmup_iters"),
      "scheduler.lr_warmup_fraction and scheduler.lr_warmup_iters are not both set; the fraction is in [0, 1).")
def _warmup_exclusive(cfg: "ConfigContainer", world_size: int) -> None:
    s = cfg.scheduler
    if s.lr_warmup_fraction is not None:
        if s.lr_warmup_iters:
            fail(f"set only one of scheduler.lr_warmup_fraction={s.lr_warmup_fraction} and "
                 f"scheduler.lr_warmup_iters={s.lr_warmup_iters}", "scheduler.lr_warmup_fraction",
                 "scheduler.lr_warmup_iters")
        if not 0 <= s.lr_warmup_fraction < 1:
            fail(f"scheduler.lr_warmup_fraction={s.lr_warmup_fraction} must be in [0, 1)",
                 "scheduler.lr_warmup_fraction")


@rule("scheduler_wsd_decay", ("scheduler.lr_wsd_decay_iters", "scheduler.lr_decay_style"),
      "With lr_decay_style 'WSD', lr_wsd_decay_iters is set and fits in the decay steps after warmup.")
def _wsd_decay(cfg: "ConfigContainer", world_size: int) -> None:
    s = cfg.scheduler
    warmup, decay = cfg.lr_warmup_iters, cfg.lr_decay_iters
    if s.lr_decay_style == "WSD" and (s.lr_wsd_decay_iters is None or s.lr_wsd_decay_iters > decay - warmup):
        fail(f"scheduler.lr_decay_style='WSD' needs scheduler.lr_wsd_decay_iters in 0..{decay - warmup} "
             f"(decay minus warmup; got {s.lr_wsd_decay_iters!r})", "scheduler.lr_wsd_decay_iters")


@rule("weight_decay_schedule", ("scheduler.start_weight_decay", "scheduler.end_weight_decay",
                                "scheduler.weight_decay_incr_style"),
      "With a non-constant weight-decay schedule, 0 <= start_weight_decay <= end_weight_decay, both set.")
def _wd_schedule(cfg: "ConfigContainer", world_size: int) -> None:
    s = cfg.scheduler
    for path, value in (("scheduler.start_weight_decay", s.start_weight_decay),
                        ("scheduler.end_weight_decay", s.end_weight_decay)):
        if value is not None and value < 0:
            fail(f"{path} must be >= 0 (got {value})", path)
    if s.weight_decay_incr_style != "constant":
        if s.start_weight_decay is None or s.end_weight_decay is None:
            fail(f"scheduler.weight_decay_incr_style={s.weight_decay_incr_style!r} needs start_weight_decay and "
                 "end_weight_decay", "scheduler.start_weight_decay", "scheduler.end_weight_decay")
        elif s.end_weight_decay < s.start_weight_decay:
            fail(f"scheduler.end_weight_decay={s.end_weight_decay} must be >= start_weight_decay="
                 f"{s.start_weight_decay}", "scheduler.end_weight_decay")


@rule("scheduler_resume_exclusive", ("scheduler.override_opt_param_scheduler",
                                     "scheduler.use_checkpoint_opt_param_scheduler"),
      "override_opt_param_scheduler and use_checkpoint_opt_param_scheduler are not both True.")
def _sched_resume(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.scheduler.override_opt_param_scheduler and cfg.scheduler.use_checkpoint_opt_param_scheduler:
        fail("scheduler.override_opt_param_scheduler and scheduler.use_checkpoint_opt_param_scheduler are both True: "
             "choose one", "scheduler.override_opt_param_scheduler", "scheduler.use_checkpoint_opt_param_scheduler")


@rule("precision_exclusive", ("optimizer.bf16", "optimizer.fp16"), "bf16 and fp16 are not both on.")
def _precision(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.optimizer.bf16 and cfg.optimizer.fp16:
        fail("optimizer.bf16 and optimizer.fp16 are both True: choose one (or a mixed_precision preset)",
             "optimizer.bf16", "optimizer.fp16")
