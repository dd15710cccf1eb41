"""Megatron-Bridge's training import paths and names that its examples use: ``training.state.GlobalState``,
``state.timers``, ``training.losses``."""

import math

import pytest
import torch

from megatron_bridge.errors import MegatronBridgeError, TrainingError
from megatron_bridge.training.timers import PhaseTimers


def test_global_state_is_the_training_context() -> None:
    from megatron_bridge.training.pretrain import TrainingContext
    from megatron_bridge.training.state import GlobalState, TrainState

    assert GlobalState is TrainingContext
    assert TrainState.__name__ == "TrainState"
    assert isinstance(TrainingContext.timers, property)


def test_timers_take_megatron_bridges_start_stop_form() -> None:
    timers = PhaseTimers(level=2, device=torch.device("cpu"))
    timers("batch-generator", log_level=2).start()
    sum(range(10_000))
    timers("batch-generator").stop()
    with timers("optimizer"):
        sum(range(10_000))
    window = timers.window("test")
    assert window["batch-generator"] > 0 and window["optimizer"] > 0 and window["forward-compute"] == 0


def test_a_timer_above_the_level_measures_nothing() -> None:
    timers = PhaseTimers(level=1, device=torch.device("cpu"))
    timers("batch-generator", log_level=2).start()
    timers("batch-generator").stop()
    assert "batch-generator" not in timers.window("test")
    with pytest.raises(KeyError, match="unknown timer 'nonexistent'"):
        timers("nonexistent")


def test_training_losses_has_megatron_bridges_signature() -> None:
    from megatron_bridge.training.losses import create_masked_next_token_loss_function, masked_next_token_loss

    losses, mask = torch.tensor([[1.0, 2.0, 4.0]]), torch.tensor([[1, 1, 0]])
    loss, tokens, report = masked_next_token_loss(mask, losses, check_for_nan_in_loss=True)
    assert (loss.item(), tokens.item()) == (3.0, 2.0)
    assert report["lm loss"].tolist() == [3.0, 2.0]
    loss_func = create_masked_next_token_loss_function(mask, check_for_nan_in_loss=False, check_for_spiky_loss=False)
    assert loss_func((losses, torch.tensor([[0, 1, 1]])))[0].item() == 6.0  # the (losses, loss_mask) form
    nan = torch.tensor([[math.nan, 1.0, 1.0]])
    with pytest.raises(TrainingError, match="NaN"):
        masked_next_token_loss(mask, nan)
    assert math.isnan(masked_next_token_loss(mask, nan, check_for_nan_in_loss=False)[0].item())
    with pytest.raises(MegatronBridgeError, match="check_for_spiky_loss=False"):
        masked_next_token_loss(mask, losses, check_for_spiky_loss=True)
