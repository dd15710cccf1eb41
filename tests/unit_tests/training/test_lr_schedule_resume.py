"""Resuming the LR schedule: override_opt_param_scheduler / use_checkpoint_opt_param_scheduler as in Megatron."""

import pytest
import torch

from megatron_bridge.errors import CheckpointError
from megatron_bridge.recipes import tiny_llama_pretrain_config
from megatron_bridge.training.lr_schedule import OptimizerParamScheduler


def _scheduler(lr: float, **scheduler: bool) -> OptimizerParamScheduler:
    cfg = tiny_llama_pretrain_config(train_iters=100, lr=lr)
    for key, value in scheduler.items():
        setattr(cfg.scheduler, key, value)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)
    return OptimizerParamScheduler(optimizer, cfg)


def _saved(lr: float) -> dict:
    saved = _scheduler(lr)
    saved.step(10)
    return saved.state_dict()


def test_same_schedule_resumes() -> None:
    resumed = _scheduler(1e-3)
    resumed.load_state_dict(_saved(1e-3))
    assert resumed.num_steps == 10


def test_different_schedule_without_an_option_is_a_named_error() -> None:
    with pytest.raises(CheckpointError, match=r"max_lr=0.001.*2e-3|max_lr=0.001.*0.002") as info:
        _scheduler(2e-3).load_state_dict(_saved(1e-3))
    assert "scheduler.override_opt_param_scheduler=True" in str(info.value)
    assert "scheduler.use_checkpoint_opt_param_scheduler=True" in str(info.value)


def test_override_takes_the_config_and_use_checkpoint_the_checkpoint() -> None:
    override = _scheduler(2e-3, override_opt_param_scheduler=True)
    override.load_state_dict(_saved(1e-3))
    assert override.max_lr == 2e-3
    from_ckpt = _scheduler(2e-3, use_checkpoint_opt_param_scheduler=True)
    from_ckpt.load_state_dict(_saved(1e-3))
    assert from_ckpt.max_lr == 1e-3 and from_ckpt.num_steps == 10
