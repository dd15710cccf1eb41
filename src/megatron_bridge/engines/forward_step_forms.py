"""Megatron-Bridge's forward-step forms: which steps get the training state, and how every form is called.

As Megatron-Bridge's ``prepare_forward_step_func`` (``training/utils/train_utils.py``), a step gets the state bound
as its first argument when a parameter is annotated with the state type (``GlobalState`` there; this library's
:class:`~megatron_bridge.training.pretrain.TrainingContext`, either name accepted) or when its first parameter is
named ``state`` or ``global_state``; the bound step is then always called as ``step(data_iterator, model)`` (the
schedules' call). So every form Megatron-Bridge documents runs unchanged:

=================================================================  ==================================
form                                                                called as
=================================================================  ==================================
``(data_iterator, model)``                                          ``step(data_iterator, model)``
``(data_iterator, model, return_schedule_plan=False)``              ``step(data_iterator, model)``
``(state, data_iterator, model)``                                   ``step(state, data_iterator, model)``
``(state, data_iterator, model, return_schedule_plan=False)``       ``step(state, data_iterator, model)``
=================================================================  ==================================

Functors (objects with ``__call__``) are inspected through ``__call__``. :func:`check_forward_step_signature` refuses,
before anything is built, a step that cannot be called that way (e.g. a required third parameter that is not the
state).
"""

import inspect
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from torch import nn

from megatron_bridge.errors import ForwardStepError


STATE_NAMES = ("state", "global_state")
"""First-parameter names that get the state (Megatron-Bridge's name fallback)."""

STATE_TYPE_NAMES = ("GlobalState", "TrainingContext")
"""Annotation names that get the state: Megatron-Bridge's ``GlobalState`` and this library's ``TrainingContext``."""


def _is_state_annotation(annotation: Any) -> bool:
    if annotation is inspect.Parameter.empty:
        return False
    if isinstance(annotation, str):
        return any(name in annotation for name in STATE_TYPE_NAMES)
    return getattr(annotation, "__name__", None) in STATE_TYPE_NAMES


def needs_global_state_injection(forward_step_func: Callable[..., Any]) -> bool:
    """True when ``forward_step_func`` takes the state first (a state-typed parameter, or a first parameter named
    ``state`` / ``global_state``), as Megatron-Bridge decides."""
    parameters = inspect.signature(forward_step_func).parameters
    if any(_is_state_annotation(p.annotation) for p in parameters.values()):
        return True
    names = list(parameters)
    return bool(names) and names[0] in STATE_NAMES


def prepare_forward_step_func(forward_step_func: Callable[..., Any], state: Any) -> Callable[..., Any]:
    """The step to call as ``step(data_iterator, model)``: ``partial(forward_step_func, state)`` when it takes the
    state (:func:`needs_global_state_injection`), else ``forward_step_func`` itself."""
    if needs_global_state_injection(forward_step_func):
        return partial(forward_step_func, state)
    return forward_step_func


def check_forward_step_signature(forward_step_func: Callable[..., Any]) -> None:
    """Refuse a step that cannot be called as ``step(data_iterator, model)`` once its state is bound.

    Raises:
        ForwardStepError: not callable, or its parameters do not take ``(data_iterator, model)`` (after the state).
    """
    name = getattr(forward_step_func, "__name__", type(forward_step_func).__name__)
    if not callable(forward_step_func):
        raise ForwardStepError(f"forward_step_func={forward_step_func!r} is not callable: pass a function or an "
                               "object with __call__ taking (data_iterator, model)")
    try:
        signature = inspect.signature(forward_step_func)
    except (TypeError, ValueError):  # a builtin without a signature: it is called as it is
        return
    args: tuple[Any, ...] = (None, None, None) if needs_global_state_injection(forward_step_func) else (None, None)
    try:
        signature.bind(*args)
    except TypeError as exc:
        raise ForwardStepError(
            f"forward_step_func {name}{signature} cannot be called as Megatron-Bridge calls forward steps ({exc}): "
            "use one of (data_iterator, model), (data_iterator, model, return_schedule_plan=False), "
            "(state, data_iterator, model) or (state, data_iterator, model, return_schedule_plan=False); the state "
            "is passed when the first parameter is named 'state' or a parameter is annotated GlobalState / "
            "TrainingContext") from None


def call_forward_step(step: Callable[..., Any], state: Any, data_iterator: Iterator[Any], model: nn.Module) -> Any:
    """Call ``step`` in any form of the module docstring: with ``state`` first when it takes it."""
    return prepare_forward_step_func(step, state)(data_iterator, model)


FORWARD_STEP_RETURNS = ("a forward step must return (output_tensor, loss_func), where loss_func(output_tensor) "
                        "returns (loss_sum, num_tokens, report) — e.g. `return model(tokens, ...), "
                        "partial(loss_func, loss_mask)` as megatron_bridge.training.gpt_step.forward_step does")
"""What a forward step returns, for the errors about a step that returns something else."""


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"a {type(value).__name__} of shape {list(value.shape)}"
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)} item(s): {', '.join(type(v).__name__ for v in value[:4])}"
    return f"{type(value).__name__} {value!r}"[:120]


def forward_step_result(result: Any, step: Callable[..., Any]) -> tuple[Any, Callable[..., Any]]:
    """``(output_tensor, loss_func)`` from what ``step`` returned.

    Raises:
        ForwardStepError: the step returned something else (None, a tensor, a number, a loss function that is not
            callable), naming what it returned and what a forward step must return.
    """
    if isinstance(result, tuple | list) and len(result) == 2 and callable(result[1]):
        return result[0], result[1]
    func = getattr(step, "func", step)  # a partial binding the state
    name = getattr(func, "__qualname__", type(func).__name__)
    raise ForwardStepError(f"forward_step_func {name} returned {_describe(result)}; {FORWARD_STEP_RETURNS}")


def loss_func_result(result: Any, loss_func: Callable[..., Any]) -> tuple[Any, Any, Any]:
    """``(loss_sum, num_tokens, report)`` from what a forward step's ``loss_func`` returned.

    Raises:
        ForwardStepError: it returned something else, naming what and the form expected.
    """
    if isinstance(result, tuple | list) and len(result) == 3:
        return result[0], result[1], result[2]
    func = getattr(loss_func, "func", loss_func)
    name = getattr(func, "__qualname__", type(func).__name__)
    raise ForwardStepError(f"the loss_func {name} of the forward step returned {_describe(result)}; "
                           f"{FORWARD_STEP_RETURNS}")
