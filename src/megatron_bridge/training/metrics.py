"""Training metrics: the stdout log line (last rank), a progress bar on terminals, and TensorBoard scalars."""

import math
import resource
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.utils.dist_env import is_last_rank
from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)


@dataclass
class StepMetrics:
    """What one optimizer step measured."""

    step: int
    loss: float
    grad_norm: float
    lr: float
    step_time: float
    tokens: int
    flops: float
    consumed_samples: int
    params_norm: float | None = None
    moe_aux_loss: float | None = None
    """MoE auxiliary loss of the step (sum over MoE layers), when the model has one."""
    loss_scale: float = 1.0
    reported_losses: dict[str, float] = field(default_factory=dict)
    """Losses the forward step reports besides the objective (e.g. "lm loss", "logits distillation loss")."""

    @property
    def objective_name(self) -> str:
        """Name the step's loss is logged under: "lm loss", or "total loss" when the report has its own "lm loss"."""
        return "total loss" if "lm loss" in self.reported_losses else "lm loss"


TENSORBOARD_TAGS: dict[str, str] = {
    "lm loss": "training loss (mean over the step's tokens), per step; also `lm loss vs samples`",
    "learning-rate": "learning rate after the step's schedule update; also `... vs samples`",
    "batch-size": "global batch size in samples; also `... vs samples`",
    "loss-scale": "fp16 loss scale (1.0 without fp16); also `... vs samples`",
    "world-size": "number of processes; also `... vs samples`",
    "grad-norm": "global L2 gradient norm before clipping; also `... vs samples`",
    "params-norm": "global L2 norm of the parameters (with logger.log_params_norm); also `... vs samples`",
    "iteration-time": "seconds per step",
    "throughput/tflops/device": "model TFLOP/s per device (10^12 FLOP/s)",
    "throughput/tflops": "model TFLOP/s over all devices",
    "throughput/tokens_per_sec": "tokens/s over all devices",
    "throughput/device/tokens_per_sec": "tokens/s per device",
    "throughput/samples_per_sec": "samples/s over all devices",
    "throughput/device/samples_per_sec": "samples/s per device",
    "memory/mem-allocated-gigabytes": "CUDA allocator: allocated memory now, GB (10^9 bytes); CPU: resident set now",
    "memory/mem-max-allocated-gigabytes": "CUDA allocator: peak allocated, GB; CPU: peak resident set size",
    "memory/mem-reserved-gigabytes": "CUDA only: reserved by the caching allocator now, GB",
    "memory/mem-max-reserved-gigabytes": "CUDA only: peak reserved, GB",
    "lm loss validation": "validation loss (eval_iters batches); also `lm loss validation ppl`",
    "total loss": "distillation: the training objective (balanced distillation and LM losses), per step; also "
                  "`total loss vs samples`; `lm loss` is then the student's LM loss",
    "logits distillation loss": "distillation: modelopt's logits KL loss (mean over the step's tokens)",
    "intermediate distillation loss": "distillation with distillation.intermediate_layer_pairs: the cosine losses",
}
"""The scalars written to TensorBoard (Megatron-Bridge's names) and their units; docs list this table."""
DISTILLATION_TAGS = ("total loss", "logits distillation loss", "intermediate distillation loss")
"""The tags of :data:`TENSORBOARD_TAGS` written only by distillation runs (Megatron-Bridge's ``loss_func_kd``)."""


def memory_report(device: torch.device) -> dict[str, float]:
    """Memory in gigabytes (10^9 bytes) under Megatron-Bridge's names: CUDA allocator statistics on GPU; on CPU the
    process's current and peak resident set size as ``mem-allocated``/``mem-max-allocated``."""
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        keys = {"allocated_bytes.all.current": "mem-allocated-gigabytes",
                "allocated_bytes.all.peak": "mem-max-allocated-gigabytes",
                "reserved_bytes.all.current": "mem-reserved-gigabytes",
                "reserved_bytes.all.peak": "mem-max-reserved-gigabytes"}
        return {name: stats.get(key, 0) / 1e9 for key, name in keys.items()}
    return {"mem-allocated-gigabytes": _current_rss_bytes() / 1e9,
            "mem-max-allocated-gigabytes": peak_memory_bytes(device) / 1e9}


def _current_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return peak_memory_bytes(torch.device("cpu"))


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory: CUDA allocator peak on GPU, else the process's peak resident set size."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss * (1 if sys.platform == "darwin" else 1024))


class TrainingLogger:
    """Prints a Megatron-style line every ``logger.log_interval`` steps and writes TensorBoard scalars."""

    def __init__(self, cfg: ConfigContainer, device: torch.device, world_size: int) -> None:
        self.cfg = cfg
        self.device = device
        self.world_size = world_size
        self.enabled = is_last_rank()
        self._window: list[StepMetrics] = []
        self._writer: Any = None
        self._progress = self.enabled and cfg.logger.log_progress and sys.stderr.isatty()
        if self.enabled and cfg.logger.tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=cfg.logger.tensorboard_dir, max_queue=1000)

    def log_step(self, m: StepMetrics) -> None:
        """Record a step; print and write scalars when their intervals are due."""
        if not self.enabled:
            return
        self._window.append(m)
        if self._writer is not None and m.step % self.cfg.logger.tensorboard_log_interval == 0:
            self._write_scalars(m)
        if m.step % self.cfg.logger.log_interval == 0 or m.step == self.cfg.train_iters:
            self._print_window()
        elif self._progress:
            self._print_progress(m.step)

    def _rates(self, m: StepMetrics) -> tuple[float, float]:
        tokens_per_s = m.tokens / m.step_time if m.step_time > 0 else 0.0
        tflops = m.flops / m.step_time / self.world_size / 1e12 if m.step_time > 0 else 0.0
        return tokens_per_s, tflops

    def _write_scalars(self, m: StepMetrics) -> None:
        """TensorBoard scalars under Megatron-Bridge's tag names (see :data:`TENSORBOARD_TAGS` for units)."""
        w, samples = self._writer, m.consumed_samples

        def both(tag: str, value: float) -> None:  # the tag per step and its "vs samples" twin, as Megatron does
            w.add_scalar(tag, value, m.step)
            w.add_scalar(f"{tag} vs samples", value, samples)

        both(m.objective_name, m.loss)
        for name, value in m.reported_losses.items():
            w.add_scalar(name, value, m.step)
        both("learning-rate", m.lr)
        both("batch-size", self.cfg.train.global_batch_size)
        both("loss-scale", m.loss_scale)
        both("world-size", self.world_size)
        both("grad-norm", m.grad_norm)
        if m.params_norm is not None:
            both("params-norm", m.params_norm)
        w.add_scalar("iteration-time", m.step_time, m.step)
        if self.cfg.logger.log_throughput:
            tokens_per_s, tflops = self._rates(m)
            samples_per_s = self.cfg.train.global_batch_size / m.step_time if m.step_time > 0 else 0.0
            w.add_scalar("throughput/tflops/device", tflops, m.step)
            w.add_scalar("throughput/tflops", tflops * self.world_size, m.step)
            w.add_scalar("throughput/tokens_per_sec", tokens_per_s, m.step)
            w.add_scalar("throughput/device/tokens_per_sec", tokens_per_s / self.world_size, m.step)
            w.add_scalar("throughput/samples_per_sec", samples_per_s, m.step)
            w.add_scalar("throughput/device/samples_per_sec", samples_per_s / self.world_size, m.step)
        if self.cfg.logger.log_memory:
            for tag, value in memory_report(self.device).items():
                w.add_scalar(f"memory/{tag}", value, m.step)

    def _print_window(self) -> None:
        window, self._window = self._window, []
        last = window[-1]
        step_time = sum(m.step_time for m in window) / len(window)
        loss = sum(m.loss for m in window) / len(window)
        parts = [
            f"iteration {last.step:>6d}/{self.cfg.train_iters}",
            f"consumed samples {last.consumed_samples}",
            f"elapsed time per iteration (ms) {step_time * 1000:.1f}",
            f"learning rate {last.lr:.4e}",
            f"global batch size {self.cfg.train.global_batch_size}",
            f"{last.objective_name} {loss:.6e}",
        ]
        parts += [f"{name} {sum(m.reported_losses.get(name, 0.0) for m in window) / len(window):.6e}"
                  for name in last.reported_losses]
        parts.append(f"grad norm {last.grad_norm:.4f}")
        if last.params_norm is not None:
            parts.append(f"params norm {last.params_norm:.4f}")
        if last.moe_aux_loss is not None:
            parts.append(f"load balancing loss {last.moe_aux_loss:.6e}")
        if self.cfg.logger.log_throughput:
            avg = StepMetrics(last.step, loss, last.grad_norm, last.lr, step_time, last.tokens, last.flops, 0)
            tokens_per_s, tflops = self._rates(avg)
            parts += [f"tokens/s {tokens_per_s:.0f}", f"TFLOP/s/device {tflops:.4f}"]
        if self.cfg.logger.log_memory:
            parts.append(f"peak memory (GB) {peak_memory_bytes(self.device) / 1e9:.2f}")
        if self._progress:
            sys.stderr.write("\r" + " " * 60 + "\r")
        logger.info(" | ".join(parts))

    def _print_progress(self, step: int) -> None:
        total = max(self.cfg.train_iters, 1)
        filled = int(30 * step / total)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {step}/{total}")
        sys.stderr.flush()

    def log_moe(self, step: int, stats: Any) -> None:
        """TensorBoard scalars of the MoE layers (every ``logger.tensorboard_log_interval`` steps):
        ``moe/load_balancing_loss`` (sum over layers) and ``moe/load_balancing_loss/layer_NN``; per layer the expert
        load ``moe/tokens_per_expert/layer_NN`` (a histogram over experts, bucket = expert id) and
        ``moe/max_over_mean_load/layer_NN`` (1.0 is perfectly balanced)."""
        if not self.enabled or self._writer is None or step % self.cfg.logger.tensorboard_log_interval:
            return
        w = self._writer
        if stats.aux_loss is not None:
            w.add_scalar("moe/load_balancing_loss", stats.aux_loss, step)
        for layer, value in stats.layer_aux_loss.items():
            w.add_scalar(f"moe/load_balancing_loss/layer_{layer:02d}", value, step)
        for layer, counts in stats.tokens_per_expert.items():
            _add_expert_histogram(w, f"moe/tokens_per_expert/layer_{layer:02d}", counts, step)
            mean = sum(counts) / max(len(counts), 1)
            if mean > 0:
                w.add_scalar(f"moe/max_over_mean_load/layer_{layer:02d}", max(counts) / mean, step)

    def log_eval(self, step: int, loss: float, split: str = "validation") -> None:
        """Print and record an evaluation result."""
        if not self.enabled:
            return
        ppl = math.exp(min(loss, 20.0))
        logger.info(f"{split} loss at iteration {step} | lm loss value: {loss:.6e} | lm loss PPL: {ppl:.6e}")
        if self._writer is not None:
            samples = step * self.cfg.train.global_batch_size
            for tag, value in ((f"lm loss {split}", loss), (f"lm loss {split} ppl", ppl)):
                self._writer.add_scalar(tag, value, step)
                self._writer.add_scalar(f"{tag} vs samples", value, samples)

    def close(self) -> None:
        """Flush and close TensorBoard."""
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


def _add_expert_histogram(writer: Any, tag: str, counts: list[float], step: int) -> None:
    """A histogram whose bucket ``e`` (edges ``e - 0.5 .. e + 0.5``) holds expert ``e``'s token count."""
    n = len(counts)
    total = float(sum(counts))
    writer.add_histogram_raw(
        tag, min=0.0, max=float(n - 1), num=total, sum=float(sum(e * c for e, c in enumerate(counts))),
        sum_squares=float(sum(e * e * c for e, c in enumerate(counts))),
        bucket_limits=[e + 0.5 for e in range(n)], bucket_counts=[float(c) for c in counts], global_step=step,
    )


class Timer:
    """Wall-clock timer that synchronizes CUDA before reading, so step times are real."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.start = 0.0

    def reset(self) -> None:
        """Start timing now."""
        self._sync()
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds since ``reset``."""
        self._sync()
        return time.perf_counter() - self.start

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
