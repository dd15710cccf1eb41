"""Callbacks: user code that runs at fixed points of ``pretrain`` (Megatron-Bridge's callback events, trimmed)."""

from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    from megatron_bridge.training.metrics import StepMetrics


class Callback:
    """Override the events you need; each receives the TrainingContext (model, optimizer, state, config, ...)."""

    def on_train_start(self, ctx: Any) -> None:
        """After set-up (and checkpoint load), before the first step."""

    def on_step_end(self, ctx: Any, metrics: "StepMetrics") -> None:
        """After each optimizer step, with what the step measured."""

    def on_train_end(self, ctx: Any) -> None:
        """After the last step and the final checkpoint save, before process groups are torn down."""


def fire(callbacks: list[Callback], event: str, *args: Any) -> None:
    """Call ``event`` on every callback in order."""
    for cb in callbacks:
        getattr(cb, event)(*args)
