"""``model.deterministic_mode``: the environment and torch flag a deterministic run sets before training."""

import os

import pytest
import torch

from megatron_bridge.training.determinism import DETERMINISTIC_ENV, apply_deterministic_mode


@pytest.fixture
def restore_torch_flag():
    before = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(before)


def test_off_changes_nothing(monkeypatch: pytest.MonkeyPatch, restore_torch_flag: None) -> None:
    for key in DETERMINISTIC_ENV:
        monkeypatch.delenv(key, raising=False)
    torch.use_deterministic_algorithms(False)
    apply_deterministic_mode(False)
    assert not torch.are_deterministic_algorithms_enabled()
    assert not any(key in os.environ for key in DETERMINISTIC_ENV)


def test_on_sets_megatron_bridges_environment_and_torch_flag(monkeypatch: pytest.MonkeyPatch,
                                                             restore_torch_flag: None) -> None:
    for key in DETERMINISTIC_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NCCL_ALGO", "Tree")  # the user's value wins
    torch.use_deterministic_algorithms(False)
    apply_deterministic_mode(True)
    assert torch.are_deterministic_algorithms_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert os.environ["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] == "0"
    assert os.environ["NCCL_ALGO"] == "Tree"
