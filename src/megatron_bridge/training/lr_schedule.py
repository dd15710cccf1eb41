"""Learning-rate warmup + decay and the weight-decay schedule, stepped once per optimizer step.

Styles follow Megatron's ``OptimizerParamScheduler``: constant, linear, cosine, inverse-square-root and WSD
(warmup-stable-decay with an exponential, linear, cosine or minus-sqrt final phase).
"""

import math
from typing import Any

import torch

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.errors import CheckpointError


class OptimizerParamScheduler:
    """Sets ``lr`` and ``weight_decay`` of every param group from the step count.

    Param groups with ``weight_decay == 0`` at construction (norms, biases) keep 0.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, cfg: ConfigContainer) -> None:
        s, o = cfg.scheduler, cfg.optimizer
        self.optimizer = optimizer
        self.max_lr = o.lr
        self.min_lr = o.min_lr
        self.warmup_init = s.lr_warmup_init
        self.warmup_steps = cfg.lr_warmup_iters
        self.decay_steps = cfg.lr_decay_iters
        self.decay_style = s.lr_decay_style
        self.wsd_decay_style = s.lr_wsd_decay_style
        self.wsd_decay_steps = s.lr_wsd_decay_iters or 0
        self.start_wd = s.start_weight_decay if s.start_weight_decay is not None else o.weight_decay
        self.end_wd = s.end_weight_decay if s.end_weight_decay is not None else o.weight_decay
        self.wd_incr_style = s.weight_decay_incr_style
        self.override_from_config = s.override_opt_param_scheduler
        self.use_checkpoint = s.use_checkpoint_opt_param_scheduler
        self.num_steps = 0
        for group in optimizer.param_groups:
            group.setdefault("decays", group.get("weight_decay", 0.0) > 0)
        self.step(0)

    def get_lr(self) -> float:
        """Learning rate at the current step."""
        n = self.num_steps
        if self.warmup_steps > 0 and n <= self.warmup_steps:
            return self.warmup_init + (self.max_lr - self.warmup_init) * n / self.warmup_steps
        if self.decay_style == "constant":
            return self.max_lr
        if n > self.decay_steps:
            return self.min_lr
        if self.decay_style == "inverse-square-root":
            warmup = max(self.warmup_steps, 1)
            return max(self.min_lr, self.max_lr * math.sqrt(warmup) / math.sqrt(max(n, 1)))
        span = self.max_lr - self.min_lr
        if self.decay_style == "WSD":
            anneal_start = self.decay_steps - self.wsd_decay_steps
            if n <= anneal_start:
                return self.max_lr
            ratio = (n - anneal_start) / max(self.wsd_decay_steps, 1)
            return self.min_lr + span * _wsd_coeff(self.wsd_decay_style, ratio)
        ratio = (n - self.warmup_steps) / max(self.decay_steps - self.warmup_steps, 1)
        if self.decay_style == "linear":
            coeff = 1.0 - ratio
        else:  # cosine
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + span * coeff

    def get_weight_decay(self) -> float:
        """Weight decay at the current step."""
        if self.wd_incr_style == "constant" or self.decay_steps <= 0:
            return self.end_wd if self.wd_incr_style != "constant" else self.start_wd
        ratio = min(self.num_steps / self.decay_steps, 1.0)
        if self.wd_incr_style == "linear":
            coeff = ratio
        else:  # cosine
            coeff = 0.5 * (math.cos(math.pi * (1 - ratio)) + 1.0)
        return self.start_wd + (self.end_wd - self.start_wd) * coeff

    def step(self, increment: int = 1) -> None:
        """Advance by ``increment`` optimizer steps and write lr / weight_decay into the param groups."""
        self.num_steps += increment
        lr, wd = self.get_lr(), self.get_weight_decay()
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)
            group["weight_decay"] = wd * group.get("wd_mult", 1.0) if group["decays"] else 0.0

    def state_dict(self) -> dict[str, Any]:
        """The schedule's state (plain numbers)."""
        return {
            "num_steps": self.num_steps,
            "max_lr": self.max_lr,
            "min_lr": self.min_lr,
            "warmup_steps": self.warmup_steps,
            "decay_steps": self.decay_steps,
            "decay_style": self.decay_style,
            "start_wd": self.start_wd,
            "end_wd": self.end_wd,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the step and the schedule constants, as Megatron does: with
        ``scheduler.override_opt_param_scheduler`` the config's constants win, with
        ``scheduler.use_checkpoint_opt_param_scheduler`` the checkpoint's; with neither they must agree.

        Raises:
            CheckpointError: neither option is set and a constant differs between the config and the checkpoint.
        """
        for key, path in _SCHEDULE_CONSTANTS.items():
            if key not in state or self.override_from_config:
                continue
            if self.use_checkpoint:
                setattr(self, key, state[key])
            elif state[key] != getattr(self, key):
                raise CheckpointError(
                    f"the checkpoint's learning-rate schedule has {key}={state[key]!r} but the config gives "
                    f"{getattr(self, key)!r} ({path}): set scheduler.override_opt_param_scheduler=True to use the "
                    "config's schedule, or scheduler.use_checkpoint_opt_param_scheduler=True to keep the checkpoint's."
                )
        self.num_steps = 0
        self.step(int(state["num_steps"]))


_SCHEDULE_CONSTANTS: dict[str, str] = {
    "max_lr": "optimizer.lr", "min_lr": "optimizer.min_lr", "warmup_steps": "scheduler.lr_warmup_iters",
    "decay_steps": "scheduler.lr_decay_iters", "decay_style": "scheduler.lr_decay_style",
    "start_wd": "scheduler.start_weight_decay", "end_wd": "scheduler.end_weight_decay",
}
"""Schedule constants saved in checkpoints, and the config field each one comes from."""


def _wsd_coeff(style: str, ratio: float) -> float:
    """Remaining fraction (1 → 0) of the WSD anneal phase at ``ratio`` in [0, 1]."""
    if style == "linear":
        return 1.0 - ratio
    if style == "cosine":
        return 0.5 * (math.cos(math.pi * ratio) + 1.0)
    if style == "minus_sqrt":
        return 1.0 - math.sqrt(ratio)
    return 2.0 ** (-10.0 * ratio) if ratio < 1.0 else 0.0  # exponential
