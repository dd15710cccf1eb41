"""Megatron-Bridge's forward-step forms (src/megatron/bridge/training/utils/train_utils.py at 067f987:
``needs_global_state_injection``/``maybe_inject_state``, called by megatron-core's schedules as
``step(data_iterator, model)``): each form receives what Megatron-Bridge gives it, a step no form fits is refused
before ``pretrain`` builds anything, and ``pretrain`` takes Megatron-Bridge's keyword names."""

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from megatron_bridge.engines.forward_step_forms import (
    call_forward_step,
    check_forward_step_signature,
    forward_step_result,
    loss_func_result,
    needs_global_state_injection,
    prepare_forward_step_func,
)
from megatron_bridge.errors import ForwardStepError


STATE, DATA, MODEL = object(), object(), object()


def _calls(step: Any) -> list[tuple[Any, ...]]:
    """Call ``step`` the way the loop and the schedules do; return what it recorded."""
    check_forward_step_signature(step)
    prepare_forward_step_func(step, STATE)(DATA, MODEL)
    return step.calls if hasattr(step, "calls") else step.__defaults__[-1]


def test_two_arguments_data_iterator_and_model() -> None:
    def step(data_iterator: Any, model: Any, calls: list = []) -> None:  # noqa: B006
        calls.append((data_iterator, model))

    assert not needs_global_state_injection(step)
    assert _calls(step) == [(DATA, MODEL)]


def test_three_arguments_return_schedule_plan_gets_no_state() -> None:
    def step(data_iterator: Any, model: Any, return_schedule_plan: bool = False, calls: list = []) -> None:  # noqa: B006
        calls.append((data_iterator, model, return_schedule_plan))

    assert not needs_global_state_injection(step)
    assert _calls(step) == [(DATA, MODEL, False)]


def test_three_arguments_state_first() -> None:
    def step(state: Any, data_iterator: Any, model: Any, calls: list = []) -> None:  # noqa: B006
        calls.append((state, data_iterator, model))

    assert needs_global_state_injection(step)
    assert _calls(step) == [(STATE, DATA, MODEL)]


def test_four_arguments_state_and_return_schedule_plan() -> None:
    def step(state: Any, data_iterator: Any, model: Any, return_schedule_plan: bool = False,
             calls: list = []) -> None:  # noqa: B006
        calls.append((state, data_iterator, model, return_schedule_plan))

    assert _calls(step) == [(STATE, DATA, MODEL, False)]


def test_global_state_name_and_annotations_get_the_state() -> None:
    def by_name(global_state: Any, data_iterator: Any, model: Any, calls: list = []) -> None:  # noqa: B006
        calls.append((global_state, data_iterator, model))

    def by_annotation(s: "GlobalState", data_iterator: Any, model: Any, calls: list = []) -> None:  # noqa: B006, F821
        calls.append((s, data_iterator, model))

    def by_our_type(ctx: "TrainingContext", data_iterator: Any, model: Any,  # noqa: F821
                    calls: list = []) -> None:  # noqa: B006
        calls.append((ctx, data_iterator, model))

    for step in (by_name, by_annotation, by_our_type):
        assert _calls(step) == [(STATE, DATA, MODEL)], step.__name__


def test_functor_is_inspected_through_call() -> None:
    class Step:
        def __init__(self) -> None:
            self.calls: list[tuple[Any, ...]] = []

        def __call__(self, state: Any, data_iterator: Any, model: Any, return_schedule_plan: bool = False) -> None:
            self.calls.append((state, data_iterator, model, return_schedule_plan))

    functor = Step()
    assert _calls(functor) == [(STATE, DATA, MODEL, False)]
    call_forward_step(functor, STATE, DATA, MODEL)  # the public helper: the same call
    assert functor.calls[-1] == (STATE, DATA, MODEL, False)


def test_prepared_step_is_not_bound_twice() -> None:
    def step(state: Any, data_iterator: Any, model: Any, calls: list = []) -> None:  # noqa: B006
        calls.append((state, data_iterator, model))

    bound = prepare_forward_step_func(step, STATE)
    assert isinstance(bound, partial) and prepare_forward_step_func(bound, object()) is bound


@pytest.mark.parametrize("step", [
    lambda data_iterator: None,
    lambda data_iterator, model, extra: None,
    lambda state, data_iterator: None,
    lambda state, data_iterator, model, return_schedule_plan, extra: None,
    "not a function",
], ids=["one_argument", "required_third", "state_without_model", "five_required", "not_callable"])
def test_unfit_step_is_a_named_error(step: Any) -> None:
    with pytest.raises(ForwardStepError, match="forward_step_func"):
        check_forward_step_signature(step)


def test_pretrain_takes_megatron_bridge_keywords_and_refuses_unfit_step_before_building(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pretrain(config=..., forward_step_func=..., callbacks=...)``: a 4-argument step runs with the state; an
    unfit one is refused before the run folder exists."""
    from megatron_bridge.recipes import tiny_llama_pretrain_config
    from megatron_bridge.training.gpt_step import forward_step
    from megatron_bridge.training.pretrain import TrainingContext, pretrain

    monkeypatch.chdir(tmp_path)
    seen: list[tuple[Any, bool]] = []

    def step(state: Any, data_iterator: Any, model: Any, return_schedule_plan: bool = False) -> Any:
        seen.append((state, return_schedule_plan))
        return forward_step(data_iterator, model)

    def cfg(folder: str) -> Any:
        config = tiny_llama_pretrain_config(dir=str(tmp_path / folder), train_iters=1)
        config.checkpoint.save = None
        return config

    with pytest.raises(ForwardStepError):
        pretrain(config=cfg("refused"), forward_step_func=lambda data_iterator: None)
    assert not (tmp_path / "refused").exists()
    result = pretrain(config=cfg("ran"), forward_step_func=step, callbacks=[])
    assert result.final_step == 1 and seen
    assert all(isinstance(s, TrainingContext) and rsp is False for s, rsp in seen)


@pytest.mark.parametrize(("returned", "described"), [
    (None, "None"),
    (torch.zeros(2, 3), r"a Tensor of shape \[2, 3\]"),
    (1.5, "float 1.5"),
    ((torch.zeros(()), "not callable"), "a tuple of 2 item"),
], ids=["none", "tensor", "float", "loss_func_not_callable"])
def test_a_step_that_returns_the_wrong_thing_is_named(returned: Any, described: str) -> None:
    """Issue 45, item 7: the error names the step, what it returned and what a forward step must return."""
    def my_step(data_iterator: Any, model: Any) -> Any:
        return returned

    with pytest.raises(ForwardStepError, match=rf"forward_step_func .*my_step returned {described}.*a forward step "
                       r"must return \(output_tensor, loss_func\)"):
        forward_step_result(my_step(DATA, MODEL), partial(my_step))


def test_a_loss_func_that_returns_the_wrong_thing_is_named() -> None:
    def my_loss(output: Any) -> Any:
        return output.sum()

    assert loss_func_result((1, 2, {}), my_loss) == (1, 2, {})
    with pytest.raises(ForwardStepError, match=r"the loss_func .*my_loss of the forward step returned a Tensor of "
                       r"shape \[\]; .*returns \(loss_sum, num_tokens, report\)"):
        loss_func_result(my_loss(torch.ones(2)), my_loss)


@pytest.mark.parametrize("returned", [None, "tensor", 1.5])
def test_pretrain_names_a_step_that_returns_the_wrong_thing(returned: Any, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron_bridge.recipes import tiny_llama_pretrain_config
    from megatron_bridge.training.pretrain import pretrain

    monkeypatch.chdir(tmp_path)
    value = torch.zeros(()) if returned == "tensor" else returned
    config = tiny_llama_pretrain_config(dir=str(tmp_path / "run"), train_iters=1)
    config.checkpoint.save = None
    with pytest.raises(ForwardStepError, match="returned .*; a forward step must return"):
        pretrain(config=config, forward_step_func=lambda data_iterator, model: value)
