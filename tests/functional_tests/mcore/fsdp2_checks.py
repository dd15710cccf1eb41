"""Worker-side checks of test_wrappers.py's FSDP2 checkpoint cases (``dist.use_torch_fsdp2`` on megatron-core chunks):
full-tensor state snapshots (model weights, megatron-core's main parameters and their Adam state; FSDP2's DTensor
shards gathered, so states of FSDP2 and megatron-core DDP runs compare key by key), the check that an async save in
flight is not a checkpoint yet, and the start of a run from a ``pretrained_checkpoint``.

A launch runs its cases in one worker process per rank, in order: a saving case records its snapshots in
:data:`SNAPSHOTS`, a later case of the same launch compares with them.
"""

from pathlib import Path
from typing import Any

import torch

from megatron_bridge.training.callbacks import Callback
from tests.functional_tests.mcore.state_recorder import StateRecorder
from tests.functional_tests.mcore.test_checkpoint import assert_same_state, snapshot


SNAPSHOTS: dict[str, "Recorder"] = {}
"""Worker: the snapshots of this launch's saving runs, by case name."""


def full_snapshot(ctx: Any) -> dict[str, Any]:
    """test_checkpoint.py's :func:`snapshot` (this rank's model weights, main parameters, Adam state) with every
    DTensor gathered to its full tensor (collective: every rank, same order)."""
    from torch.distributed.tensor import DTensor

    return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in snapshot(ctx).items()}


class Recorder(StateRecorder):
    """Full snapshots (:func:`full_snapshot`) at the start, at step ``step`` and at the end."""

    def __init__(self, step: int) -> None:
        super().__init__(step, full_snapshot)


def check_precision(recorded: Recorder, name: str) -> None:
    """bf16_mixed as Megatron-Bridge means it: bf16 model weights, fp32 main parameters and Adam state."""
    state = recorded.final
    assert {v.dtype for k, v in state.items() if k.startswith("model")} == {torch.bfloat16}, name
    assert {v.dtype for k, v in state.items() if k.startswith("main")} == {torch.float32}, name
    assert {v.dtype for k, v in state.items() if k.endswith(("exp_avg", "exp_avg_sq"))} == {torch.float32}, name


def check_resumed(resumed: Recorder, saved: Recorder, name: str, *, final: bool) -> None:
    """The state right after loading equals the saving run's at its save step (model weights, fp32 main parameters,
    Adam state, bit for bit); with ``final`` the end state too."""
    assert resumed.start_step == saved.step, (name, resumed.start_step)
    assert_same_state(resumed.start, saved.at_step, f"{name}: state after loading step {saved.step}")
    if final:
        assert_same_state(resumed.final, saved.final, f"{name}: final state")


def check_pretrained_start(started: Recorder, saved: Recorder, name: str) -> None:
    """A ``pretrained_checkpoint`` start (Megatron-Bridge's finetune start): step 0, the saved model weights bit for
    bit, main parameters taken from those weights (megatron-core's ``reload_model_params``), no Adam state."""
    assert started.start_step == 0, (name, started.start_step)
    model = {k: v for k, v in started.start.items() if k.startswith("model")}
    assert_same_state(model, {k: v for k, v in saved.at_step.items() if k.startswith("model")},
                      f"{name}: model weights after loading")
    mains = {k: v for k, v in started.start.items() if k.startswith("main")}
    saved_mains = {k: v for k, v in saved.at_step.items() if k.startswith("main")}
    assert set(mains) == set(saved_mains) and mains, name
    for key, value in mains.items():  # the saved bf16 weights, in fp32: not the saved fp32 main parameters
        want = saved_mains[key].to(torch.bfloat16).float()
        assert value.dtype == torch.float32 and torch.equal(value, want), (name, key)
    assert not [k for k in started.start if k.startswith("state")], f"{name}: the optimizer starts fresh"


class AsyncSaveInFlight(Callback):
    """At the end of step ``step + 1`` (the step-``step`` async save started; it is finalized in that step's poll,
    after the callbacks): the writer may be done, but the step is neither ``iter_<step>`` nor in the trackers — only
    its temporary folder exists."""

    def __init__(self, root: Path, step: int) -> None:
        self.root, self.step, self.checked = root, step, False

    def on_train_step_end(self, ctx: Any) -> None:
        if ctx.train_state.step != self.step + 1:
            return
        names = {p.name for p in self.root.iterdir()}
        committed = {f"iter_{self.step:07d}", "latest_checkpointed_iteration.txt", "latest_train_state.pt"}
        assert not committed & names, names
        assert any(n.startswith(f"iter_{self.step:07d}.tmp-") for n in names), names
        self.checked = True


def check_async_committed(root: Path, steps: tuple[int, ...]) -> None:
    """After the run: every async save committed (megatron-core's files and ours), the tracker names the last, no
    temporary folder is left."""
    from megatron_bridge.checkpoint import files

    assert files.read_tracker_step(root) == steps[-1]
    for step in steps:
        folder = root / f"iter_{step:07d}"
        assert {"manifest.json", "metadata.json", ".metadata", "train_state.pt"} <= {p.name for p in folder.iterdir()}
    assert not [p.name for p in root.iterdir() if ".tmp-" in p.name]
