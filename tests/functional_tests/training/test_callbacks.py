"""Callbacks in a tiny one-process ``pretrain``: Megatron-Bridge's events fire where its trainer fires them (the
loop is engine-agnostic), ``on_train_step_end`` once per step with the step's losses, and the example of its
docs/training/callbacks.md (at 067f987) runs with only the package rename."""

import re
from pathlib import Path
from typing import Any

import pytest

from megatron_bridge.training.callbacks import VALID_EVENTS, Callback, CallbackManager
from megatron_bridge.training.pretrain import pretrain
from tests.functional_tests.training._common import small_config


pytestmark = pytest.mark.timeout(300)


class Recorder(Callback):
    """Records every event with the fields Megatron-Bridge sets for it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, set[str]]] = []
        self.losses: list[float] = []

    def _note(self, name: str, context: Any) -> None:
        fields = {f for f in ("optimizer", "scheduler", "loss_dict", "grad_norm", "skipped_iter", "total_loss_dict")
                  if getattr(context, f) is not None}
        assert isinstance(context.model, list) and context.state.cfg is not None
        self.seen.append((name, context.state.train_state.step, fields))


for _event in sorted(VALID_EVENTS):  # override every event with a recorder
    setattr(Recorder, _event, lambda self, ctx, _e=_event: self._note(_e, ctx))


def _events(recorder: Recorder, *names: str) -> list[tuple[str, int]]:
    return [(e, step) for e, step, _ in recorder.seen if not names or e in names]


def test_events_fire_in_megatron_bridges_order_with_its_fields(tmp_path: Path) -> None:
    cfg = small_config(train_iters=4, eval_interval=2)
    cfg.validation.eval_iters = 2
    cfg.checkpoint.save, cfg.checkpoint.save_interval = str(tmp_path / "ckpt"), 2
    recorder = Recorder()
    result = pretrain(cfg, callbacks=[recorder])
    assert result.final_step == 4
    step = ["on_train_step_start", "on_train_step_end"]
    evaluation = ["on_eval_start", "on_eval_step_start", "on_eval_step_end", "on_eval_step_start",
                  "on_eval_step_end", "on_eval_end"]
    expected = (["on_data_init_start", "on_train_start"] + step * 2 + evaluation + ["on_checkpoint_save"]
                + step * 2 + evaluation + ["on_checkpoint_save", "on_train_end"])
    assert [e for e, _ in _events(recorder)] == expected
    fields = {e: f for e, _, f in recorder.seen}
    assert fields["on_train_step_end"] == {"optimizer", "scheduler", "loss_dict", "grad_norm", "skipped_iter"}
    assert fields["on_eval_end"] == {"total_loss_dict"} and fields["on_eval_step_start"] == set()
    assert fields["on_train_start"] == fields["on_data_init_start"] == {"optimizer", "scheduler"}
    assert fields["on_checkpoint_save"] == {"optimizer"}


def test_train_step_end_fires_once_per_step_with_the_steps_loss() -> None:
    seen: list[tuple[int, float, float, bool]] = []

    def step_end(context: Any) -> None:
        seen.append((context.state.train_state.step, float(context.loss_dict["lm loss"]), context.grad_norm,
                     context.skipped_iter))

    manager = CallbackManager()
    manager.register("on_train_step_end", step_end)
    result = pretrain(small_config(train_iters=5), callbacks=manager)
    assert [s for s, *_ in seen] == [1, 2, 3, 4, 5]
    assert [loss for _, loss, *_ in seen] == pytest.approx(result.losses)
    assert [g for *_, g, _ in seen] == pytest.approx(result.grad_norms)
    assert not any(skipped for *_, skipped in seen)


CALLBACKS_MD_EXAMPLE = '''
import time

from megatron_bridge.training.callbacks import Callback
from megatron_bridge.training.gpt_step import forward_step
from megatron_bridge.training.pretrain import pretrain
from megatron_bridge.recipes.qwen import qwen25_500m_pretrain_config

class MyCallback(Callback):
    def on_train_start(self, context):
        context.user_state['start_time'] = time.time()
        print(f"Training started at step {context.state.train_state.step}")

    def on_train_step_end(self, context):
        if context.loss_dict:
            print(f"Step {context.state.train_state.step}: loss={context.loss_dict}")

    def on_train_end(self, context):
        elapsed = time.time() - context.user_state['start_time']
        print(f"Training completed in {elapsed:.2f}s")

# Create a config that fits on a single GPU
config = qwen25_500m_pretrain_config()

# Pass callbacks to pretrain
pretrain(config, forward_step, callbacks=[MyCallback()])
'''
"""docs/training/callbacks.md's first example, ``megatron.bridge`` renamed ``megatron_bridge``."""


def test_megatron_bridge_docs_example_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """The Qwen2.5 recipes are not shipped (docs/megatron-bridge-differences.md): the example's recipe name gives the
    tiny config here, the "local path" of this test."""
    import megatron_bridge.recipes.qwen as qwen

    monkeypatch.setattr(qwen, "qwen25_500m_pretrain_config", lambda: small_config(train_iters=3), raising=False)
    exec(compile(CALLBACKS_MD_EXAMPLE, "callbacks.md", "exec"), {"__name__": "callbacks_md"})
    out = capsys.readouterr().out
    assert "Training started at step 0" in out
    assert re.findall(r"^Step (\d+): loss=\{'lm loss': tensor\(", out, re.M) == ["1", "2", "3"]
    assert re.search(r"^Training completed in \d+\.\d\ds$", out, re.M)
