"""Training metrics: the stdout log line (last rank), a progress bar on terminals, and TensorBoard scalars
(:mod:`megatron_bridge.training.tensorboard`, Megatron-Bridge's tags and switches)."""

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.training.tensorboard import TensorBoardScalars, memory_report, peak_memory_bytes
from megatron_bridge.training.timers import PhaseTimers, max_over_ranks
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
    mtp_losses: dict[str, float] = field(default_factory=dict)
    """Multi-token prediction: each depth's loss of the step, as ``{"mtp_1 loss": ...}`` (megatron-core's names)."""
    reported_losses: dict[str, float] = field(default_factory=dict)
    """Losses the forward step reports besides the objective (e.g. "lm loss", "logits distillation loss")."""

    @property
    def objective_name(self) -> str:
        """Name the step's loss is logged under: "lm loss", or "total loss" when the report has its own "lm loss"."""
        return "total loss" if "lm loss" in self.reported_losses else "lm loss"


class TrainingLogger:
    """Prints a Megatron-style line every ``logger.log_interval`` steps and writes TensorBoard scalars.

    Called on every rank: the phase timers and memory written to TensorBoard, and the timers printed, are maxima over
    ranks (one small all-reduce at the steps that write them, only when they are switched on); only the last rank
    prints and writes.
    """

    def __init__(self, cfg: ConfigContainer, device: torch.device, world_size: int,
                 timers: PhaseTimers | None = None) -> None:
        self.cfg = cfg
        self.device = device
        self.world_size = world_size
        self.timers = timers if timers is not None else PhaseTimers(cfg.logger.timing_log_level, device)
        self.enabled = is_last_rank()
        self._window: list[StepMetrics] = []
        self._progress = self.enabled and cfg.logger.log_progress and sys.stderr.isatty()
        self.tensorboard = TensorBoardScalars(cfg, world_size) if self.enabled and cfg.logger.tensorboard_dir else None

    def log_step(self, m: StepMetrics) -> None:
        """Record a step; print and write scalars when their intervals are due (call on every rank)."""
        lc = self.cfg.logger
        self.timers.end_step()
        if lc.skip_train_metrics_log:
            return
        tb_due = lc.tensorboard_dir is not None and m.step % lc.tensorboard_log_interval == 0
        log_due = m.step % lc.log_interval == 0 or m.step == self.cfg.train_iters
        tb_timers, memory, line_timers = self._rank_maxima(tb_due, log_due)
        if not self.enabled:
            return
        self._window.append(m)
        if self.tensorboard is not None:
            self.tensorboard.record_time(m.step, time.perf_counter())
            if tb_due:
                self.tensorboard.step(m, tb_timers, memory)
        if log_due:
            self._print_window(line_timers)
        elif self._progress:
            self._print_progress(m.step)

    def _rank_maxima(self, tb_due: bool, log_due: bool) -> tuple[dict[str, float], ...]:
        """(TensorBoard timers, memory, stdout timers), each the maximum over ranks; empty where not due."""
        lc, names = self.cfg.logger, self.timers.names
        parts = [self.timers.window("tensorboard") if tb_due and lc.log_timers_to_tensorboard and names else {},
                 memory_report(self.device, lc.memory_keys) if tb_due and lc.log_memory_to_tensorboard else {},
                 self.timers.window("stdout") if log_due and names else {}]
        flat = iter(max_over_ranks([v for part in parts for v in part.values()], self.device))
        return tuple({key: next(flat) for key in part} for part in parts)

    def _print_window(self, timers: dict[str, float]) -> None:
        window, self._window = self._window, []
        last = window[-1]
        step_time = sum(m.step_time for m in window) / len(window)
        total_time = sum(m.step_time for m in window)
        tflops = sum(m.flops for m in window) / total_time / self.world_size / 1e12 if total_time > 0 else 0.0
        if self.tensorboard is not None:
            timed = self.cfg.logger.timing_log_level >= 0
            self.tensorboard.interval(last.step, step_time if timed else None, tflops)
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
        parts += self._optional_parts(last, window, tflops)
        if self._progress:
            sys.stderr.write("\r" + " " * 60 + "\r")
        logger.info(" | ".join(parts))
        ran = [f"{name} {seconds * 1000:.2f}" for name, seconds in timers.items() if seconds > 0]
        if ran:
            logger.info("timers (ms per step, max over ranks): " + " | ".join(ran))

    def _optional_parts(self, last: StepMetrics, window: list[StepMetrics], tflops: float) -> list[str]:
        parts = [f"grad norm {last.grad_norm:.4f}"]
        if last.params_norm is not None:
            parts.append(f"params norm {last.params_norm:.4f}")
        if last.moe_aux_loss is not None:
            parts.append(f"load balancing loss {last.moe_aux_loss:.6e}")
        parts += [f"{name} {sum(m.mtp_losses.get(name, 0.0) for m in window) / len(window):.6e}"
                  for name in last.mtp_losses]
        if self.cfg.logger.log_throughput:
            total_time = sum(m.step_time for m in window)
            tokens_per_s = sum(m.tokens for m in window) / total_time if total_time > 0 else 0.0
            parts += [f"tokens/s {tokens_per_s:.0f}", f"TFLOP/s/device {tflops:.4f}"]
        if self.cfg.logger.log_memory:
            parts.append(f"peak memory (GB) {peak_memory_bytes(self.device) / 1e9:.2f}")
        return parts

    def _print_progress(self, step: int) -> None:
        total = max(self.cfg.train_iters, 1)
        filled = int(30 * step / total)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {step}/{total}")
        sys.stderr.flush()

    def log_moe(self, step: int, stats: Any) -> None:
        """TensorBoard scalars of the MoE layers every ``logger.tensorboard_log_interval`` steps
        (:meth:`TensorBoardScalars.moe`)."""
        lc = self.cfg.logger
        if self.tensorboard is not None and step % lc.tensorboard_log_interval == 0 and not lc.skip_train_metrics_log:
            self.tensorboard.moe(step, stats)

    def log_eval(self, step: int, loss: float, split: str = "validation") -> None:
        """Print and record an evaluation result."""
        if not self.enabled:
            return
        ppl = math.exp(min(loss, 20.0))
        logger.info(f"{split} loss at iteration {step} | lm loss value: {loss:.6e} | lm loss PPL: {ppl:.6e}")
        if self.tensorboard is not None:
            self.tensorboard.eval(step, split, loss, ppl)

    def close(self) -> None:
        """Flush and close TensorBoard."""
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
