"""Callbacks: user code run at fixed points of ``pretrain`` — Megatron-Bridge's callback API.

Two ways to register, mixable, fired in registration order:

- subclass :class:`Callback` and override the events you need, pass ``pretrain(..., callbacks=[MyCallback()])``;
- ``manager = CallbackManager(); manager.register("on_train_step_end", fn)``, pass ``callbacks=manager``.

Every event receives one :class:`CallbackContext`. The events and where the loop fires them are listed in
docs/training/callbacks.md. A method named ``on_...`` that is no event (``on_step_end``, ``on_validation_end``) is
refused when the callback is added, instead of never being called.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from megatron_bridge.errors import CallbackError


if TYPE_CHECKING:
    import torch

    from megatron_bridge.training.metrics import StepMetrics


VALID_EVENTS: frozenset[str] = frozenset({
    "on_data_init_start",
    "on_train_start", "on_train_step_start", "on_train_step_end", "on_train_end",
    "on_eval_start", "on_eval_step_start", "on_eval_step_end", "on_eval_end",
    "on_test_start", "on_test_step_start", "on_test_step_end", "on_test_end",
    "on_checkpoint_save",
})
"""Megatron-Bridge's event names (``on_test_*`` are accepted but never fire: this library has no test pass)."""


@dataclass
class CallbackContext:
    """What an event receives (Megatron-Bridge's fields; which are set for which event: docs/training/callbacks.md).

    ``state`` is the run's :class:`~megatron_bridge.training.pretrain.TrainingContext` (Megatron-Bridge's
    ``GlobalState``: ``state.cfg``, ``state.train_state``, ...). Attributes the context does not declare are read
    from ``state``, so ``context.backend`` or ``context.train_state`` work too.
    """

    state: Any
    model: list[Any]
    """The model chunks (a list, also with a single chunk)."""
    user_state: dict = field(default_factory=dict)
    """One dict per run, shared by every callback (``CallbackManager.user_state``)."""
    optimizer: Any = None
    scheduler: Any = None
    loss_dict: dict[str, torch.Tensor] | None = None
    """``on_train_step_end``: the step's global token-weighted losses, ``{"lm loss": tensor, ...}``."""
    grad_norm: float | None = None
    skipped_iter: bool | None = None
    total_loss_dict: dict[str, torch.Tensor] | None = None
    """``on_eval_end``: the validation losses, ``{"lm loss": tensor}``."""
    step_metrics: StepMetrics | None = None
    """``on_train_step_end`` (this library's addition): everything the step measured (time, lr, tokens, ...)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "state":  # copy/pickle probes; no recursion before ``state`` is set
            raise AttributeError(name)
        try:
            return getattr(self.state, name)
        except AttributeError:
            raise AttributeError(f"CallbackContext has no attribute {name!r} (nor has its state)") from None


class Callback:
    """Base class: override the events you need (each takes the :class:`CallbackContext`); the rest do nothing."""

    def on_data_init_start(self, context: CallbackContext) -> None:
        """Model, optimizer and checkpoint are ready; the data loaders are not built yet."""

    def on_train_start(self, context: CallbackContext) -> None:
        """Before the first training step (after set-up and checkpoint load)."""

    def on_train_step_start(self, context: CallbackContext) -> None:
        """Before each training step."""

    def on_train_step_end(self, context: CallbackContext) -> None:
        """After each training step (``loss_dict``, ``grad_norm``, ``skipped_iter``, ``step_metrics``)."""

    def on_train_end(self, context: CallbackContext) -> None:
        """After the last step and the final checkpoint save."""

    def on_eval_start(self, context: CallbackContext) -> None:
        """After ``model.eval()``, before the validation batches."""

    def on_eval_step_start(self, context: CallbackContext) -> None:
        """Before each validation batch (one global batch)."""

    def on_eval_step_end(self, context: CallbackContext) -> None:
        """After each validation batch."""

    def on_eval_end(self, context: CallbackContext) -> None:
        """After validation (``total_loss_dict``), before ``model.train()``."""

    def on_test_start(self, context: CallbackContext) -> None:
        """Never fired here: this library has no test pass."""

    def on_test_step_start(self, context: CallbackContext) -> None:
        """Never fired here: this library has no test pass."""

    def on_test_step_end(self, context: CallbackContext) -> None:
        """Never fired here: this library has no test pass."""

    def on_test_end(self, context: CallbackContext) -> None:
        """Never fired here: this library has no test pass."""

    def on_checkpoint_save(self, context: CallbackContext) -> None:
        """After a checkpoint save was started (asynchronous saves finish later)."""


_OTHER_NAMES = (("on_validation_", "on_eval_"), ("on_valid_", "on_eval_"), ("on_val_", "on_eval_"),
                ("on_step_", "on_train_step_"), ("on_batch_", "on_train_step_"), ("on_fit_", "on_train_"),
                ("on_save_checkpoint", "on_checkpoint_save"))
"""Other frameworks' (and this library's former) event names and Megatron-Bridge's."""


def _nearest_event(name: str) -> str | None:
    for old, new in _OTHER_NAMES:
        if name.startswith(old) and name.replace(old, new, 1) in VALID_EVENTS:
            return name.replace(old, new, 1)
    near = difflib.get_close_matches(name, sorted(VALID_EVENTS), n=1, cutoff=0.6)
    return near[0] if near else None


def _unknown_event_error(owner: str, name: str) -> CallbackError:
    near = _nearest_event(name)
    hint = f"did you mean {near}?" if near else f"the events are {', '.join(sorted(VALID_EVENTS))}"
    return CallbackError(f"{owner}: {name!r} is not a callback event, so it would never be called; {hint}")


def _check_event(name: str, owner: str = "CallbackManager.register") -> None:
    if name not in VALID_EVENTS:
        raise _unknown_event_error(owner, name)


def _overridden_events(cb: Any, where: str) -> list[str]:
    """The events ``cb`` handles; refuses ``on_...`` methods that are no event and objects with no event at all."""
    for name in dir(type(cb)):
        if name.startswith("on_") and name not in VALID_EVENTS and callable(getattr(cb, name, None)):
            raise _unknown_event_error(f"{where} ({type(cb).__name__})", name)
    if not isinstance(cb, Callback) and not any(callable(getattr(cb, e, None)) for e in VALID_EVENTS):
        raise CallbackError(
            f"{where} is a {type(cb).__name__}, not a callback: pass Callback instances, or register functions with "
            'CallbackManager().register("on_train_step_end", fn)'
        )
    return [e for e in sorted(VALID_EVENTS)
            if getattr(type(cb), e, None) is not getattr(Callback, e) and callable(getattr(cb, e, None))]


class CallbackManager:
    """The registered callbacks by event, and the run's ``user_state`` dict."""

    def __init__(self) -> None:
        self._callbacks: dict[str, list[Callable[[CallbackContext], None]]] = {e: [] for e in VALID_EVENTS}
        self._user_state: dict = {}

    @property
    def user_state(self) -> dict:
        """Data callbacks keep across events (the same dict in every context)."""
        return self._user_state

    @property
    def events(self) -> frozenset[str]:
        """The valid event names."""
        return VALID_EVENTS

    def add(self, callback: Any | list[Any]) -> None:
        """Register the events each :class:`Callback` overrides, in order."""
        items = callback if isinstance(callback, list) else [callback]
        for i, cb in enumerate(items):
            for event in _overridden_events(cb, f"callbacks[{i}]" if isinstance(callback, list) else "callback"):
                self._callbacks[event].append(getattr(cb, event))

    def register(self, event_name: str, fn: Callable[[CallbackContext], None]) -> None:
        """Register ``fn(context)`` for ``event_name``."""
        _check_event(event_name)
        if not callable(fn):
            raise CallbackError(f"CallbackManager.register({event_name!r}, ...): {fn!r} is not callable")
        self._callbacks[event_name].append(fn)

    def list_callbacks(self, event_name: str) -> list[Callable[[CallbackContext], None]]:
        """The callables registered for ``event_name``, in firing order."""
        _check_event(event_name, "CallbackManager.list_callbacks")
        return list(self._callbacks[event_name])

    def has_callbacks(self, event_name: str) -> bool:
        """Whether anything is registered for ``event_name``."""
        return bool(self._callbacks.get(event_name))

    def fire(self, event_name: str, context: CallbackContext) -> None:
        """Call every callable of ``event_name`` with ``context``; exceptions propagate."""
        for fn in self._callbacks[event_name]:
            fn(context)


def normalize_callbacks(callbacks: list[Any] | CallbackManager | None) -> CallbackManager | None:
    """``pretrain``'s ``callbacks`` argument as a manager (None stays None)."""
    if callbacks is None or isinstance(callbacks, CallbackManager):
        return callbacks
    if not isinstance(callbacks, list | tuple):
        raise CallbackError(
            f"callbacks is a {type(callbacks).__name__}: pass a list of Callback instances or a CallbackManager"
        )
    manager = CallbackManager()
    manager.add(list(callbacks))
    return manager


def should_fire(callback_manager: CallbackManager | None, event_name: str) -> bool:
    """Whether ``event_name`` has anything to call (False without a manager)."""
    return callback_manager is not None and callback_manager.has_callbacks(event_name)


def fire_event(ctx: Any, event_name: str, **fields: Any) -> None:
    """Fire ``event_name`` for the run ``ctx`` (a TrainingContext holding the manager in ``ctx.callbacks``)."""
    manager = ctx.callbacks
    if should_fire(manager, event_name):
        context = CallbackContext(state=ctx, model=list(ctx.backend.chunks), user_state=manager.user_state, **fields)
        manager.fire(event_name, context)
