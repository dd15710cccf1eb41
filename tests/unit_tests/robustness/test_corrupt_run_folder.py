"""Corrupt run folders are named errors on every path that reads them, and training and convert.py agree on the
latest step (issue 27 item 4): a tracker holding non-digits or non-UTF-8 bytes, train states whose fields have the
wrong types, and a tracker that disagrees with latest_train_state.pt (a save killed between the two writes)."""

from pathlib import Path

import pytest
import torch

from megatron_bridge.bridge.convert import resolve_checkpoint_folder
from megatron_bridge.checkpoint import files
from megatron_bridge.checkpoint import load as loading
from megatron_bridge.checkpoint.train_state import TrainState
from megatron_bridge.errors import CheckpointError
from tests.unit_tests.checkpoint.toy import build_run, tiny_cfg, train


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder with committed steps 2 and 4."""
    root = tmp_path_factory.mktemp("run")
    run = build_run(tiny_cfg(save=str(root)))
    for _ in range(2):
        train(run, 2)
        run.manager.save()
    run.manager.close()
    return root


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize(("content", "says"), [(b"4x\n", "holds '4x'"), (b"\xff\xfe\x00", "holds bytes that are not "
                                                                                       "text"),
                                               ("٤\n".encode(), "holds '٤'")])
def test_bad_tracker_is_named_by_training_and_convert(run_folder: Path, tmp_path: Path, content: bytes,
                                                      says: str) -> None:
    root = _copy(run_folder, tmp_path / "run")
    (root / files.LATEST_TRAIN_STATE_FILENAME).unlink()
    (root / files.TRACKER_FILENAME).write_bytes(content)
    pattern = rf"latest_checkpointed_iteration.txt' should hold a step number but {says}.*committed steps \[2, 4\]"
    with pytest.raises(CheckpointError, match=pattern):
        build_run(tiny_cfg(save=str(root), load=str(root))).manager.load()
    with pytest.raises(CheckpointError, match=pattern):
        resolve_checkpoint_folder(root)


@pytest.mark.parametrize("step", ["4", 4.0, True, -1, [4]])
def test_train_state_tracker_with_a_wrong_step_is_named(run_folder: Path, tmp_path: Path, step: object) -> None:
    root = _copy(run_folder, tmp_path / "run")
    torch.save({"step": step}, root / files.LATEST_TRAIN_STATE_FILENAME)
    with pytest.raises(CheckpointError, match=r"latest_train_state.pt' holds no integer 'step'"):
        loading.latest_step(root)
    with pytest.raises(CheckpointError, match=r"holds no integer 'step'"):
        resolve_checkpoint_folder(root)


@pytest.mark.parametrize(("field", "value"), [("step", "4"), ("consumed_train_samples", [1]), ("step", 4.5),
                                              ("floating_point_operations_so_far", float("nan")), ("step", -2)])
def test_train_state_fields_of_the_wrong_type_are_named(field: str, value: object) -> None:
    state = TrainState(step=7)
    with pytest.raises(CheckpointError, match=rf"run/iter_0000004/train_state.pt: field '{field}' holds .* not a "
                       r"non-negative .*Fix: load another step with checkpoint.ckpt_step"):
        state.load_state_dict({**TrainState(step=4).state_dict(), field: value}, "run/iter_0000004/train_state.pt")
    assert state.step == 7  # nothing restored


def test_train_state_accepts_megatron_bridge_tensors() -> None:
    state = TrainState()
    state.load_state_dict({"step": torch.tensor(4), "floating_point_operations_so_far": torch.tensor(2.5)})
    assert (state.step, state.floating_point_operations_so_far) == (4, 2.5)


def test_training_and_convert_pick_the_same_latest_step(run_folder: Path, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A save killed between its two tracker writes: latest_train_state.pt says 4, the .txt tracker still 2."""
    root = _copy(run_folder, tmp_path / "run")
    (root / files.TRACKER_FILENAME).write_text("2\n")
    with caplog.at_level("WARNING"):
        assert loading.latest_step(root) == 4
    assert "latest_checkpointed_iteration.txt says step 2 but latest_train_state.pt says step 4" in caplog.text
    assert resolve_checkpoint_folder(root) == files.iteration_dir(root, 4)
    assert loading.resolve_folder(root, None) == files.iteration_dir(root, 4)
