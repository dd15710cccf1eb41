"""Worker-side checks of test_wrappers.py's Megatron FSDP checkpoint cases (``dist.use_megatron_fsdp`` on megatron-core
chunks, ``fsdp_dtensor``): snapshots of each rank's part of the state — megatron-fsdp's compute-weight and fp32
main-weight buffers, the optimizer's parameters (main weights as DTensor shards) and their Adam state — so a resumed
run compares with the uninterrupted one bit for bit, rank by rank (same layout); the Megatron-Bridge-style writer at
step ``SAVE_AT``; the start of a run from a ``pretrained_checkpoint``.

A launch runs its cases in one worker process per rank, in order: a saving case records its snapshots in
:data:`SNAPSHOTS`, a later case of the same launch compares with them.
"""

import json
from pathlib import Path
from typing import Any

import torch

from megatron_bridge.training.callbacks import Callback
from tests.functional_tests.mcore.state_recorder import StateRecorder
from tests.functional_tests.mcore.test_checkpoint import assert_same_state


MEGATRON_BRIDGE_FOLDER = "megatron_bridge_fsdp_dtensor"
"""Where ``test_megatron_fsdp_optim_grads_params`` also writes its step-``SAVE_AT`` state as Megatron-Bridge does."""
MFSDP_RESUMES = {
    "test_megatron_fsdp_optim_resume": ("test_megatron_fsdp_optim", "test_megatron_fsdp_optim_ckpt"),
    "test_megatron_fsdp_optim_grads_params_resume": ("test_megatron_fsdp_optim_grads_params",
                                                     "test_megatron_fsdp_optim_grads_params_ckpt"),
    "test_megatron_fsdp_bf16_mixed_resume": ("test_megatron_fsdp_bf16_mixed", "test_megatron_fsdp_bf16_mixed_ckpt"),
    "test_megatron_fsdp_no_shard_resume": ("test_megatron_fsdp_no_shard", "test_megatron_fsdp_no_shard_ckpt"),
    "test_megatron_bridge_fsdp_dtensor_checkpoint_resumes": ("test_megatron_fsdp_optim_grads_params",
                                                             MEGATRON_BRIDGE_FOLDER),
}
"""Megatron FSDP case resuming an fsdp_dtensor checkpoint at step ``SAVE_AT`` → (the case of the same launch, before
it, that saved it; the checkpoint's folder): its losses, and its state after loading and at the end, equal the saving
run's bit for bit (:func:`check_case`)."""
MFSDP_PRETRAINED = {"test_megatron_fsdp_pretrained_checkpoint": "test_megatron_fsdp_optim_grads_params"}
"""Megatron FSDP case starting from ``checkpoint.pretrained_checkpoint`` (the saving case's checkpoint folder, its
latest step) → the saving case."""
MFSDP_SAVERS = {saver for saver, _ in MFSDP_RESUMES.values()} | set(MFSDP_PRETRAINED.values())

SNAPSHOTS: dict[str, "Recorder"] = {}
"""Worker: the snapshots of this launch's saving runs, by case name."""


def _local(value: Any) -> Any:
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        value = value.to_local()
    return value.detach().clone() if torch.is_tensor(value) else value


def snapshot(ctx: Any) -> dict[str, Any]:
    """This rank's part of the weights (``weights.``: each tensor's piece in every megatron-fsdp buffer — the rest
    of a sharded buffer is scratch — and the optimizer's parameters) and of the Adam state (``adam.``), by name."""
    state: dict[str, Any] = {}
    for i, chunk in enumerate(ctx.backend.chunks):
        buffer = chunk.module.param_and_grad_buffer
        for g, group in enumerate(buffer.parameter_groups):
            for kind in ("model_weight_buffer", "main_weight_buffer"):
                buf = getattr(group, kind)
                for item in range(len(group.params) if buf is not None else 0):  # this rank's part of each tensor
                    piece = buf.get_item(item, only_shard=buf.is_data_distributed)
                    state[f"weights.{i}.{g}.{kind}.{item}"] = _local(piece)
        for name, param in buffer.optimizer_named_parameters:
            state[f"weights.{i}.{name}"] = _local(param)
            if state[f"weights.{i}.{name}"].numel() == 0:
                continue  # no piece on this rank: torch's Adam keeps no state, a loaded one holds empty moments
            for key, value in ctx.optimizer.optimizer.state.get(param, {}).items():
                state[f"adam.{i}.{name}.{key}"] = _local(value)
    return state


class Recorder(StateRecorder):
    """Per-rank snapshots (:func:`snapshot`) at the start, at step ``step`` and at the end."""

    def __init__(self, step: int) -> None:
        super().__init__(step, snapshot)


class MegatronBridgeWriter(Callback):
    """Writes the run at the end of step ``step`` as Megatron-Bridge's fsdp_dtensor save would, into ``root``
    (megatron_bridge_writer.py: megatron-core's API, none of this library's checkpoint code)."""

    def __init__(self, root: Path, step: int) -> None:
        self.root, self.step = root, step

    def on_train_step_end(self, ctx: Any) -> None:
        from tests.functional_tests.mcore.megatron_bridge_writer import write_megatron_bridge_fsdp_dtensor_checkpoint

        if ctx.train_state.step == self.step:
            write_megatron_bridge_fsdp_dtensor_checkpoint(ctx, self.root)


def check_resumed(recorded: Recorder, saved: Recorder, name: str, step: int) -> None:
    """Right after loading the step-``step`` checkpoint the state equals the saving run's at that step, and at the
    end its final state, bit for bit."""
    assert recorded.start_step == step, (name, recorded.start_step)
    assert saved.at_step and saved.final, name
    assert_same_state(recorded.start, saved.at_step, f"{name}: state after loading step {step}")
    assert_same_state(recorded.final, saved.final, f"{name}: final state")


def check_pretrained_start(recorded: Recorder, saved: Recorder, name: str) -> None:
    """A ``pretrained_checkpoint`` start (the saving run's last checkpoint): step 0, the saved weights (compute and
    main) bit for bit, a fresh optimizer (no Adam state)."""
    assert recorded.start_step == 0, (name, recorded.start_step)
    weights = {k: v for k, v in saved.final.items() if k.startswith("weights.")}
    assert_same_state(recorded.start, weights, f"{name}: weights after loading")


# ------------------------------------------------------------------------------------------ the cases
def configure_checkpoints(name: str, c: Any, work: Path, save_at: int) -> None:
    """Worker: the fsdp_dtensor save, resume or pretrained start of a Megatron FSDP checkpoint case."""
    if name in MFSDP_SAVERS:
        c.ckpt_format, c.save_interval, c.most_recent_k = "fsdp_dtensor", save_at, -1
        c.save = str(work / f"{name}_ckpt")
    if name in MFSDP_RESUMES:
        c.ckpt_format, c.load, c.ckpt_step = "fsdp_dtensor", str(work / MFSDP_RESUMES[name][1]), save_at
    if name in MFSDP_PRETRAINED:
        c.ckpt_format, c.pretrained_checkpoint = "fsdp_dtensor", str(work / f"{MFSDP_PRETRAINED[name]}_ckpt")


def case_callbacks(name: str, work: Path, save_at: int) -> list[Callback]:
    """Worker: the state recorder of the Megatron FSDP checkpoint cases, and the Megatron-Bridge-style writer."""
    callbacks: list[Callback] = []
    if name in MFSDP_SAVERS | set(MFSDP_RESUMES) | set(MFSDP_PRETRAINED):
        callbacks.append(Recorder(save_at))
    if name == MFSDP_RESUMES["test_megatron_bridge_fsdp_dtensor_checkpoint_resumes"][0]:
        callbacks.append(MegatronBridgeWriter(work / MEGATRON_BRIDGE_FOLDER, save_at))
    return callbacks


def check_case(name: str, work: Path, losses: list[float], callbacks: list[Callback], save_at: int) -> None:
    """Worker, after ``name`` trained: a saving run keeps its snapshots; a resumed one gives the saving run's losses
    from step ``save_at`` on and its state (after loading, at the end), bit for bit; a pretrained start begins at
    step 0 with the saved weights and a fresh optimizer."""
    recorded = next((c for c in callbacks if isinstance(c, Recorder)), None)
    if name in MFSDP_SAVERS:
        SNAPSHOTS[name] = recorded  # type: ignore[assignment]
    if name in MFSDP_RESUMES:
        saver, folder = MFSDP_RESUMES[name]
        saved = json.loads((work / f"{saver}.json").read_text())["losses"]
        assert losses == saved[save_at:], (losses, saved)
        assert (work / folder / f"iter_{save_at:07d}" / ".metadata").is_file()
        check_resumed(recorded, SNAPSHOTS[saver], name, save_at)  # type: ignore[arg-type]
    if name in MFSDP_PRETRAINED:
        check_pretrained_start(recorded, SNAPSHOTS[MFSDP_PRETRAINED[name]], name)  # type: ignore[arg-type]
