"""Folder names, trackers, manifest, atomic writes, most_recent_k and stale-folder cleanup (no model needed)."""

import random

import numpy as np
import pytest
import torch

from megatron_bridge.checkpoint import files
from megatron_bridge.checkpoint.rng import get_rng_state, load_rng_file, save_rng_file, set_rng_state
from megatron_bridge.errors import CheckpointError


def committed(root, step, payload=b"x"):
    """A fake committed checkpoint folder of ``step``."""
    folder = files.iteration_dir(root, step)
    folder.mkdir(parents=True)
    (folder / "data.bin").write_bytes(payload)
    files.write_manifest(folder, {"step": step, "format": "torch"})
    return folder


def test_names():
    assert files.iteration_dirname(10) == "iter_0000010"
    assert files.temporary_dir("/c", 10, "ab12").name == "iter_0000010.tmp-ab12"
    assert files.step_of("/c/iter_0000010") == 10
    assert files.step_of("/c/iter_0000010.tmp-ab12") is None


def test_only_committed_folders_count(tmp_path):
    committed(tmp_path, 3)
    committed(tmp_path, 1)
    (tmp_path / "iter_0000005").mkdir()  # no manifest: an interrupted commit
    (tmp_path / "iter_0000007.tmp-abc123").mkdir()
    assert files.list_checkpoints(tmp_path) == [1, 3]
    assert files.list_checkpoints(tmp_path / "missing") == []


def test_atomic_write_replaces_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "latest_checkpointed_iteration.txt"
    files.atomic_write_bytes(target, b"1\n")
    files.atomic_write_bytes(target, b"2\n")
    assert target.read_bytes() == b"2\n"
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_trackers(tmp_path):
    assert files.read_tracker_step(tmp_path) is None
    files.write_trackers(tmp_path, 20, b"state")
    assert files.read_tracker_step(tmp_path) == 20
    assert (tmp_path / "latest_train_state.pt").read_bytes() == b"state"
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("release")
    with pytest.raises(CheckpointError, match="release checkpoints are not supported"):
        files.read_tracker_step(tmp_path)


def test_manifest_detects_changes(tmp_path):
    folder = committed(tmp_path, 1, b"abcdef")
    assert files.verify_manifest(folder)["files"]["data.bin"]["size"] == 6
    (folder / "data.bin").write_bytes(b"abcdeX")
    with pytest.raises(CheckpointError, match="fails its crc32 check"):
        files.verify_manifest(folder)
    files.verify_manifest(folder, checksums=False)  # same size: only the checksum notices
    (folder / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="is not valid JSON"):
        files.read_manifest(folder)


def test_commit_renames_and_replaces_an_existing_step(tmp_path):
    old = committed(tmp_path, 2, b"old")
    tmp = files.temporary_dir(tmp_path, 2, files.new_save_id())
    tmp.mkdir()
    (tmp / "data.bin").write_bytes(b"new")
    files.commit(tmp, old, {"step": 2})
    assert (old / "data.bin").read_bytes() == b"new" and not tmp.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000002"]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_keep_most_recent_keeps_exactly_k(tmp_path, k):
    for step in (1, 2, 3, 4, 5):
        committed(tmp_path, step)
    files.keep_most_recent(tmp_path, k, protect=5)
    assert files.list_checkpoints(tmp_path) == [1, 2, 3, 4, 5][-k:]
    assert len([p for p in tmp_path.iterdir()]) == k  # no trash left behind


def test_keep_most_recent_never_removes_the_tracked_step(tmp_path):
    for step in (1, 2, 3):
        committed(tmp_path, step)
    files.keep_most_recent(tmp_path, 1, protect=2)  # e.g. a save of a smaller step than existing folders
    assert files.list_checkpoints(tmp_path) == [2, 3]
    assert files.keep_most_recent(tmp_path, -1) == []


def test_stale_folders_are_removed(tmp_path):
    committed(tmp_path, 1)
    (tmp_path / "iter_0000002.tmp-0123abcd").mkdir()
    (tmp_path / "iter_0000001.trash-99ff").mkdir()
    (tmp_path / "unrelated").mkdir()
    assert sorted(files.remove_stale_folders(tmp_path)) == ["iter_0000001.trash-99ff", "iter_0000002.tmp-0123abcd"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000001", "unrelated"]


def test_rng_round_trip(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # a cached gaussian is part of the state
    state = get_rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1))
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected
    save_rng_file(tmp_path, rank=0, world_size=1)
    expected = (random.random(), np.random.rand(), torch.rand(1))
    assert load_rng_file(tmp_path, rank=0, world_size=1)
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected
    assert not load_rng_file(tmp_path, rank=0, world_size=2)  # another world size: not restored
    assert not load_rng_file(tmp_path, rank=1, world_size=1)  # no file for this rank


def test_manifest_engine_reads_the_older_layout_key():
    from megatron_bridge.checkpoint.mcore_reader import MCORE_ENGINE, manifest_engine

    assert manifest_engine({"engine": MCORE_ENGINE}) == MCORE_ENGINE
    assert manifest_engine({"layout": MCORE_ENGINE}) == MCORE_ENGINE  # written before the key was renamed
    assert manifest_engine({"format": "torch_dist"}) is None  # the native engine's
