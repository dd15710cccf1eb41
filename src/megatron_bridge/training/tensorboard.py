"""TensorBoard scalars under Megatron-Bridge's tag names, each behind Megatron-Bridge's ``logger`` switch.

:data:`TENSORBOARD_TAGS` is the table (tag -> switch, meaning); docs/training/logging.md lists it and a test writes
every tag of each switch combination. Only the last rank writes.
"""

import math
import resource
import sys
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import torch

from megatron_bridge.config.container import ConfigContainer


if TYPE_CHECKING:
    from megatron_bridge.training.metrics import StepMetrics


ALWAYS = "always"
"""The switch of tags written whenever ``logger.tensorboard_dir`` is set."""

TENSORBOARD_TAGS: dict[str, tuple[str, str]] = {
    "lm loss": (ALWAYS, "training loss (mean over the step's tokens), per step; also `lm loss vs samples`"),
    "learning-rate": (ALWAYS, "learning rate of the step; also `... vs samples`"),
    "batch-size": (ALWAYS, "global batch size in samples; also `... vs samples`"),
    "grad-norm": (ALWAYS, "global L2 gradient norm before clipping; also `... vs samples`"),
    "loss-scale": ("log_loss_scale_to_tensorboard", "fp16 loss scale (1.0 without fp16); also `... vs samples`"),
    "world-size": ("log_world_size_to_tensorboard", "number of processes; also `... vs samples`"),
    "params-norm": ("log_params_norm", "global L2 norm of the parameters; also `... vs samples`"),
    "iteration-time": ("log_timers_to_tensorboard", "seconds per step, mean over the `log_interval` steps "
                                                    "(timing_log_level >= 0)"),
    "forward-backward-time": ("log_timers_to_tensorboard", "seconds per step in forward and backward passes and "
                                                           "gradient reduction (timing_log_level >= 1)"),
    "optimizer-time": ("log_timers_to_tensorboard", "seconds per step in the optimizer step (timing_log_level >= 1)"),
    "batch-generator-time": ("log_timers_to_tensorboard", "seconds per step reading micro-batches "
                                                          "(timing_log_level 2)"),
    "forward-compute-time": ("log_timers_to_tensorboard", "seconds per step in forward passes and losses "
                                                          "(timing_log_level 2, no pipeline parallelism)"),
    "backward-compute-time": ("log_timers_to_tensorboard", "seconds per step in backward passes "
                                                           "(timing_log_level 2, no pipeline parallelism)"),
    "throughput/tflops/device": ("log_throughput_to_tensorboard", "model TFLOP/s per device over the "
                                                                  "`log_interval` steps"),
    "throughput/tflops": ("log_throughput_to_tensorboard", "model TFLOP/s over all devices"),
    "throughput/batches_per_sec": ("log_throughput_to_tensorboard", "global batches per second, rolling mean over "
                                                                    "`throughput_window_size` steps"),
    "throughput/samples_per_sec": ("log_throughput_to_tensorboard", "samples/s over all devices (rolling)"),
    "throughput/tokens_per_sec": ("log_throughput_to_tensorboard", "tokens/s over all devices (rolling)"),
    "throughput/device/batches_per_sec": ("log_throughput_to_tensorboard", "batches/s divided by the world size"),
    "throughput/device/samples_per_sec": ("log_throughput_to_tensorboard", "samples/s per device"),
    "throughput/device/tokens_per_sec": ("log_throughput_to_tensorboard", "tokens/s per device"),
    "throughput/micro_batch_size": ("log_throughput_to_tensorboard", "train.micro_batch_size"),
    "throughput/global_batch_size": ("log_throughput_to_tensorboard", "train.global_batch_size"),
    "memory/mem-allocated-gigabytes": ("log_memory_to_tensorboard", "CUDA: allocated now, GB (10^9 bytes); "
                                                                    "CPU: resident set size now"),
    "memory/mem-max-allocated-gigabytes": ("log_memory_to_tensorboard", "CUDA: peak allocated; CPU: peak resident "
                                                                        "set size"),
    "memory/mem-reserved-gigabytes": ("log_memory_to_tensorboard", "CUDA only: reserved by the caching allocator"),
    "memory/mem-max-reserved-gigabytes": ("log_memory_to_tensorboard", "CUDA only: peak reserved"),
    "memory/mem-active-gigabytes": ("log_memory_to_tensorboard", "CUDA only: active memory"),
    "memory/mem-max-active-gigabytes": ("log_memory_to_tensorboard", "CUDA only: peak active memory"),
    "memory/mem-inactive-gigabytes": ("log_memory_to_tensorboard", "CUDA only: inactive, non-releasable memory"),
    "memory/mem-max-inactive-gigabytes": ("log_memory_to_tensorboard", "CUDA only: peak inactive memory"),
    "memory/mem-alloc-retires": ("log_memory_to_tensorboard", "CUDA only: cudaMalloc retries (Megatron-Bridge's "
                                                              "spelling)"),
    "memory/mem-allocated-count": ("log_memory_to_tensorboard", "CUDA only: number of live allocations"),
    "time/tokens": ("log_runtime_to_tensorboard", "tokens consumed so far (samples x seq_length)"),
    "time/samples": ("log_runtime_to_tensorboard", "samples consumed so far"),
    "time/batches": ("log_runtime_to_tensorboard", "steps done so far"),
    "time/total": ("log_runtime_to_tensorboard", "wall time since training started, in `runtime_time_unit`"),
    "time/remaining_estimate": ("log_runtime_to_tensorboard", "`time/total` scaled to the remaining steps of "
                                                              "train_iters"),
    "lm loss validation": (ALWAYS, "validation loss (eval_iters batches); also `... vs samples`"),
    "lm loss validation ppl": ("log_validation_ppl_to_tensorboard", "exp of the validation loss (capped at e^20); "
                                                                    "also `... vs samples`"),
    "total loss": (ALWAYS, "distillation: the training objective (balanced distillation and LM losses), per step; "
                           "also `total loss vs samples`; `lm loss` is then the student's LM loss"),
    "logits distillation loss": (ALWAYS, "distillation: modelopt's logits KL loss (mean over the step's tokens)"),
    "intermediate distillation loss": (ALWAYS, "distillation with distillation.intermediate_layer_pairs: the cosine "
                                               "losses"),
}
"""The scalars written to TensorBoard (Megatron-Bridge's names): tag -> (the ``logger`` switch that writes it, what
it holds); docs/training/logging.md lists this table. MoE runs add ``moe/*`` (:meth:`TensorBoardScalars.moe`)."""
DISTILLATION_TAGS = ("total loss", "logits distillation loss", "intermediate distillation loss")
"""The tags of :data:`TENSORBOARD_TAGS` written only by distillation runs (Megatron-Bridge's ``loss_func_kd``)."""
CUDA_ONLY_TAGS = tuple(tag for tag, (_, meaning) in TENSORBOARD_TAGS.items() if "CUDA only" in meaning)
"""The memory tags that have no value on CPU (no caching allocator)."""

MEMORY_KEYS: dict[str, str] = {
    "allocated_bytes.all.current": "mem-allocated-bytes",
    "active_bytes.all.current": "mem-active-bytes",
    "inactive_split_bytes.all.current": "mem-inactive-bytes",
    "reserved_bytes.all.current": "mem-reserved-bytes",
    "allocated_bytes.all.peak": "mem-max-allocated-bytes",
    "active_bytes.all.peak": "mem-max-active-bytes",
    "inactive_split_bytes.all.peak": "mem-max-inactive-bytes",
    "reserved_bytes.all.peak": "mem-max-reserved-bytes",
    "num_alloc_retries": "mem-alloc-retires",
    "allocation.all.current": "mem-allocated-count",
}
"""``logger.memory_keys``'s default: ``torch.cuda.memory_stats()`` key -> logged name (Megatron-Bridge's)."""
SECONDS_PER: dict[str, float] = {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0, "days": 86400.0}
"""Seconds in each ``logger.runtime_time_unit``."""


def memory_report(device: torch.device, memory_keys: dict[str, str] | None = None) -> dict[str, float]:
    """Memory statistics under their logged names, byte counts in gigabytes (5 significant digits) with ``bytes``
    in the name replaced by ``gigabytes``. CUDA: every key of ``memory_keys`` (0 where torch has no value, so all
    ranks report the same keys); CPU: the resident set size, now and at its peak, for the allocated keys."""
    keys = memory_keys or MEMORY_KEYS
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
    else:
        stats = {"allocated_bytes.all.current": _current_rss_bytes(), "allocated_bytes.all.peak": _peak_rss_bytes()}
        keys = {k: v for k, v in keys.items() if k in stats}
    report: dict[str, float] = {}
    for key, name in keys.items():
        value = float(stats.get(key, 0))
        if "bytes" in key:
            report[name.replace("bytes", "gigabytes")] = _significant(value / 1e9)
        else:
            report[name] = value
    return report


def _significant(value: float, digits: int = 5) -> float:
    return round(value, digits - 1 - math.floor(math.log10(abs(value)))) if value else 0.0


_HIGHEST_RSS = [0]
"""The highest resident set size this process has read so far, in bytes (:func:`_peak_rss_bytes`)."""


def _current_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return _peak_rss_bytes()
    _HIGHEST_RSS[0] = max(_HIGHEST_RSS[0], rss)
    return rss


def _peak_rss_bytes() -> int:
    """The peak resident set size: getrusage's, or a higher size read from /proc/self/statm before. Linux keeps both
    with per-CPU counters read approximately, so getrusage's peak can read below a current size read earlier (by
    ≈ 100 KB, seen 2026-12-03); a reported peak is never below a current size already reported."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _HIGHEST_RSS[0] = max(_HIGHEST_RSS[0], int(rss * (1 if sys.platform == "darwin" else 1024)))
    return _HIGHEST_RSS[0]


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory: CUDA allocator peak on GPU, else the process's peak resident set size."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return _peak_rss_bytes()


class TensorBoardScalars:
    """The last rank's TensorBoard writer: which scalars are written when, under ``cfg.logger``'s switches."""

    def __init__(self, cfg: ConfigContainer, world_size: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.cfg, self.world_size, lc = cfg, world_size, cfg.logger
        self.writer: Any = SummaryWriter(log_dir=lc.tensorboard_dir, max_queue=lc.tensorboard_queue_size)
        self._history: deque[tuple[float, int]] = deque(maxlen=lc.throughput_window_size + 1)
        self._start = time.time()

    def record_time(self, step: int, wall_time: float) -> None:
        """Remember when ``step`` ended (the rolling throughput's window)."""
        if self.cfg.logger.log_throughput_to_tensorboard:
            self._history.append((wall_time, step))

    def _both(self, tag: str, value: float, step: int, samples: int) -> None:
        """The tag per step and its ``vs samples`` twin, as Megatron-Bridge writes them."""
        self.writer.add_scalar(tag, value, step)
        self.writer.add_scalar(f"{tag} vs samples", value, samples)

    def step(self, m: "StepMetrics", timers: dict[str, float], memory: dict[str, float]) -> None:
        """The per-step scalars (every ``tensorboard_log_interval`` steps); ``timers`` and ``memory`` are the
        maxima over ranks (empty when switched off)."""
        lc, w, samples = self.cfg.logger, self.writer, m.consumed_samples
        for name, seconds in timers.items():
            if seconds > 0:  # a timer no rank ran (forward-compute under a pipeline) is not written, as in MB
                w.add_scalar(f"{name}-time", seconds, m.step)
        if lc.log_throughput_to_tensorboard:
            for tag, value in self._rolling_throughput().items():
                w.add_scalar(tag, value, m.step)
        for name, value in memory.items():
            w.add_scalar(f"memory/{name}", value, m.step)
        if lc.log_runtime_to_tensorboard:
            for tag, value in self._runtime(m).items():
                w.add_scalar(tag, value, m.step)
        self._both("learning-rate", m.lr, m.step, samples)
        self._both("batch-size", self.cfg.train.global_batch_size, m.step, samples)
        self._both(m.objective_name, m.loss, m.step, samples)
        for name, value in m.reported_losses.items():
            w.add_scalar(name, value, m.step)
        for name, value in m.mtp_losses.items():  # megatron-core's tags: "mtp_1 loss", ...
            w.add_scalar(name, value, m.step)
        if lc.log_loss_scale_to_tensorboard:
            self._both("loss-scale", m.loss_scale, m.step, samples)
        if lc.log_world_size_to_tensorboard:
            self._both("world-size", self.world_size, m.step, samples)
        self._both("grad-norm", m.grad_norm, m.step, samples)
        if m.params_norm is not None:
            self._both("params-norm", m.params_norm, m.step, samples)

    def _rolling_throughput(self) -> dict[str, float]:
        """Rates over the last ``throughput_window_size`` steps; nothing until that many steps ran."""
        if len(self._history) < max(self.cfg.logger.throughput_window_size, 2):
            return {}
        (t0, s0), (t1, s1) = self._history[0], self._history[-1]
        if t1 <= t0:
            return {}
        train, n = self.cfg.train, self.world_size
        batches = (s1 - s0) / (t1 - t0)
        samples = batches * train.global_batch_size
        tokens = samples * self.cfg.model.seq_length
        return {"throughput/batches_per_sec": batches, "throughput/samples_per_sec": samples,
                "throughput/tokens_per_sec": tokens, "throughput/device/batches_per_sec": batches / n,
                "throughput/device/samples_per_sec": samples / n, "throughput/device/tokens_per_sec": tokens / n,
                "throughput/micro_batch_size": train.micro_batch_size,
                "throughput/global_batch_size": train.global_batch_size}

    def _runtime(self, m: "StepMetrics") -> dict[str, float]:
        """Megatron-Bridge's ``time/*``: what was consumed, the time so far and the time left at this rate."""
        unit = SECONDS_PER[self.cfg.logger.runtime_time_unit]
        elapsed = time.time() - self._start
        done = m.step / max(self.cfg.train_iters, 1)
        remaining = elapsed / done * (1 - done) if done > 0 else 0.0
        tokens = m.consumed_samples * self.cfg.model.seq_length
        return {"time/remaining_estimate": remaining / unit, "time/tokens": tokens, "time/samples": m.consumed_samples,
                "time/batches": m.step, "time/total": elapsed / unit}

    def interval(self, step: int, iteration_time: float | None, tflops_per_device: float) -> None:
        """The scalars of the ``log_interval`` steps: ``iteration-time`` and model TFLOP/s."""
        lc = self.cfg.logger
        if lc.log_throughput_to_tensorboard:
            self.writer.add_scalar("throughput/tflops/device", tflops_per_device, step)
            self.writer.add_scalar("throughput/tflops", tflops_per_device * self.world_size, step)
        if lc.log_timers_to_tensorboard and iteration_time is not None:
            self.writer.add_scalar("iteration-time", iteration_time, step)

    def eval(self, step: int, split: str, loss: float, ppl: float) -> None:
        """``lm loss <split>`` and, with ``log_validation_ppl_to_tensorboard``, its perplexity."""
        samples = step * self.cfg.train.global_batch_size
        self._both(f"lm loss {split}", loss, step, samples)
        if self.cfg.logger.log_validation_ppl_to_tensorboard:
            self._both(f"lm loss {split} ppl", ppl, step, samples)

    def moe(self, step: int, stats: Any) -> None:
        """``moe/load_balancing_loss`` (sum over layers) and ``moe/load_balancing_loss/layer_NN``; per layer the
        expert load ``moe/tokens_per_expert/layer_NN`` (a histogram over experts, bucket = expert id) and
        ``moe/max_over_mean_load/layer_NN`` (1.0 is perfectly balanced)."""
        w = self.writer
        if stats.aux_loss is not None:
            w.add_scalar("moe/load_balancing_loss", stats.aux_loss, step)
        for layer, value in stats.layer_aux_loss.items():
            w.add_scalar(f"moe/load_balancing_loss/layer_{layer:02d}", value, step)
        for layer, counts in stats.tokens_per_expert.items():
            _add_expert_histogram(w, f"moe/tokens_per_expert/layer_{layer:02d}", counts, step)
            mean = sum(counts) / max(len(counts), 1)
            if mean > 0:
                w.add_scalar(f"moe/max_over_mean_load/layer_{layer:02d}", max(counts) / mean, step)

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.flush()
        self.writer.close()


def _add_expert_histogram(writer: Any, tag: str, counts: list[float], step: int) -> None:
    """A histogram whose bucket ``e`` (edges ``e - 0.5 .. e + 0.5``) holds expert ``e``'s token count."""
    n = len(counts)
    total = float(sum(counts))
    writer.add_histogram_raw(
        tag, min=0.0, max=float(n - 1), num=total, sum=float(sum(e * c for e, c in enumerate(counts))),
        sum_squares=float(sum(e * e * c for e, c in enumerate(counts))),
        bucket_limits=[e + 0.5 for e in range(n)], bucket_counts=[float(c) for c in counts], global_step=step,
    )
