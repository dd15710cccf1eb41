"""A custom forward step written for the native model calls megatron-core's ``GPTModel`` as
``model(tokens, position_ids=..., labels=...)``; the pre-hook every megatron-core chunk carries
(``engines/megatron_core/forward_step.py::accept_native_call``) makes that call bind to ``GPTModel.forward``'s own
signature, and leaves ``GPTModel``'s own form (Megatron-Bridge's steps) untouched."""

import inspect
from typing import Any

import pytest
import torch

from megatron_bridge.engines.megatron_core.forward_step import accept_native_call


TOKENS, POSITIONS, LABELS = torch.zeros(1, 4), torch.ones(1, 4), torch.full((1, 4), 2.0)


def _gpt_forward() -> inspect.Signature:
    pytest.importorskip("megatron.core")
    from megatron.core.models.gpt import GPTModel

    return inspect.signature(GPTModel.forward)


class _Recorder(torch.nn.Module):
    """A module whose forward has ``GPTModel.forward``'s signature and records what it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.got: dict[str, Any] = {}

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        bound = _gpt_forward().bind(self, *args, **kwargs)  # the real signature's TypeError, if any
        self.got = dict(bound.arguments)
        return torch.zeros(())


@pytest.mark.parametrize(("args", "kwargs", "positions"), [
    ((TOKENS,), {"position_ids": POSITIONS, "labels": LABELS}, POSITIONS),  # the native forward_step's call
    ((TOKENS, POSITIONS), {"labels": LABELS}, POSITIONS),
    ((TOKENS,), {"labels": LABELS}, None),
])
def test_native_call_binds_to_gpt_model(args: tuple, kwargs: dict, positions: Any) -> None:
    model = _Recorder()
    model.register_forward_pre_hook(accept_native_call, with_kwargs=True)
    model(*args, **kwargs)
    assert model.got["input_ids"] is TOKENS and model.got["labels"] is LABELS
    assert model.got["position_ids"] is positions and model.got["attention_mask"] is None


def test_gpt_model_form_passes_unchanged() -> None:
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    assert accept_native_call(torch.nn.Module(), (TOKENS, POSITIONS, mask), {"labels": LABELS}) is None
    assert accept_native_call(torch.nn.Module(), (TOKENS, POSITIONS), {"attention_mask": mask}) is None


def test_native_call_without_the_hook_fails_on_gpt_model() -> None:
    """What the hook fixes: the same call does not bind to ``GPTModel.forward``."""
    with pytest.raises(TypeError, match="attention_mask"):
        _gpt_forward().bind(object(), TOKENS, position_ids=POSITIONS, labels=LABELS)
