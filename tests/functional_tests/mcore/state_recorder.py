"""Worker-side state recorder shared by test_wrappers.py's checkpoint cases (:mod:`.fsdp2_checks`,
:mod:`.mfsdp_checks`): snapshots of the training state, taken by the wrapper's own snapshot function, at the start of
training (after any checkpoint load), at the end of one step and at the end of training."""

from collections.abc import Callable
from typing import Any

from megatron_bridge.training.callbacks import Callback


class StateRecorder(Callback):
    """``snapshot(ctx)`` at the start of training (``start``, with ``start_step``), at the end of step ``step``
    (``at_step``) and at the end (``final``). Every rank records (a snapshot may gather collectively)."""

    def __init__(self, step: int, snapshot: Callable[[Any], dict[str, Any]]) -> None:
        self.step = step
        self.snapshot = snapshot
        self.start: dict[str, Any] = {}
        self.at_step: dict[str, Any] = {}
        self.final: dict[str, Any] = {}
        self.start_step = -1

    def on_train_start(self, ctx: Any) -> None:
        self.start, self.start_step = self.snapshot(ctx), ctx.train_state.step

    def on_train_step_end(self, ctx: Any) -> None:
        if ctx.train_state.step == self.step:
            self.at_step = self.snapshot(ctx)

    def on_train_end(self, ctx: Any) -> None:
        self.final = self.snapshot(ctx)
