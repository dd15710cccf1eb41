"""Megatron-Bridge's callback API (src/megatron/bridge/training/callbacks.py at 067f987): its event names,
``CallbackManager`` (``add``, ``register``, ``list_callbacks``, ``has_callbacks``, ``events``, ``user_state``),
``normalize_callbacks``/``should_fire``; events it would never call are refused instead of silently ignored."""

import copy
import pickle
from typing import Any

import pytest

from megatron_bridge.errors import CallbackError
from megatron_bridge.training.callbacks import (
    VALID_EVENTS,
    Callback,
    CallbackContext,
    CallbackManager,
    normalize_callbacks,
    should_fire,
)


MEGATRON_BRIDGE_EVENTS = {
    "on_data_init_start", "on_train_start", "on_train_step_start", "on_train_step_end", "on_train_end",
    "on_eval_start", "on_eval_step_start", "on_eval_step_end", "on_eval_end",
    "on_test_start", "on_test_step_start", "on_test_step_end", "on_test_end", "on_checkpoint_save",
}


def test_events_are_megatron_bridges() -> None:
    assert VALID_EVENTS == MEGATRON_BRIDGE_EVENTS
    assert CallbackManager().events == MEGATRON_BRIDGE_EVENTS
    assert all(callable(getattr(Callback, e)) for e in MEGATRON_BRIDGE_EVENTS)


def test_add_registers_only_overridden_events_and_fires_in_registration_order() -> None:
    calls: list[str] = []

    class First(Callback):
        def on_train_start(self, context: Any) -> None:
            calls.append("first")
            context.user_state["n"] = 1

    manager = CallbackManager()
    manager.add(First())
    manager.register("on_train_start", lambda ctx: calls.append(f"fn{ctx.user_state['n']}"))
    manager.add([First()])
    assert manager.has_callbacks("on_train_start") and not manager.has_callbacks("on_train_end")
    assert len(manager.list_callbacks("on_train_start")) == 3 and manager.list_callbacks("on_eval_end") == []
    manager.fire("on_train_start", CallbackContext(state=None, model=[], user_state=manager.user_state))
    assert calls == ["first", "fn1", "first"] and manager.user_state == {"n": 1}


@pytest.mark.parametrize(("name", "hint"), [
    ("on_step_end", "did you mean on_train_step_end?"),
    ("on_validation_end", "did you mean on_eval_end?"),
    ("on_eval_ends", "did you mean on_eval_end?"),
    ("on_my_helper", "the events are on_checkpoint_save"),
])
def test_a_method_no_event_matches_is_refused(name: str, hint: str) -> None:
    bad = type("Typo", (Callback,), {name: lambda self, ctx: None})()
    with pytest.raises(CallbackError, match=rf"callbacks\[0\] \(Typo\): '{name}' is not a callback event.*{hint}"):
        normalize_callbacks([bad])


def test_register_refuses_an_unknown_event_and_a_non_callable() -> None:
    manager = CallbackManager()
    with pytest.raises(CallbackError, match="'on_train_step_ends' is not a callback event.*on_train_step_end"):
        manager.register("on_train_step_ends", print)
    with pytest.raises(CallbackError, match="not callable"):
        manager.register("on_train_end", 3)
    with pytest.raises(CallbackError, match="list_callbacks"):
        manager.list_callbacks("on_bogus")


def test_non_callbacks_are_refused_with_the_fix() -> None:
    with pytest.raises(CallbackError, match=r"callbacks\[0\] is a function, not a callback.*register"):
        normalize_callbacks([lambda ctx: None])
    with pytest.raises(CallbackError, match="pass a list of Callback instances or a CallbackManager"):
        normalize_callbacks(Callback())


def test_normalize_and_should_fire() -> None:
    manager = CallbackManager()
    assert normalize_callbacks(None) is None and normalize_callbacks(manager) is manager
    assert not should_fire(None, "on_train_start") and not should_fire(manager, "on_train_start")
    manager.register("on_train_start", print)
    assert should_fire(manager, "on_train_start")

    class Duck:  # any object with event methods, as Megatron-Bridge's add() accepts
        def on_train_end(self, context: Any) -> None: ...

    assert normalize_callbacks([Duck()]).has_callbacks("on_train_end")


def test_context_reads_undeclared_attributes_from_state_and_copies() -> None:
    class State:
        cfg = "config"

    context = CallbackContext(state=State(), model=[1], user_state={"a": 1})
    assert context.cfg == "config" and context.optimizer is None and context.model == [1]
    with pytest.raises(AttributeError, match="CallbackContext has no attribute 'nope'"):
        _ = context.nope
    assert copy.deepcopy(context).user_state == {"a": 1}
    assert pickle.loads(pickle.dumps(CallbackContext(state=None, model=[]))).model == []
