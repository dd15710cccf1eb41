"""The checkpoint.save folder: a lock (second writer refused, stale lock taken over), no silent overwrite, a load
path that is not a checkpoint, interrupted saves cleaned at start-up, and a full disk (an injected ENOSPC)."""

import errno
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch.distributed.checkpoint as dcp

from megatron_bridge.checkpoint import files, run_folder
from megatron_bridge.errors import CheckpointError, CheckpointOverwriteError, DiskFullError, RunFolderLockedError
from tests.unit_tests.checkpoint.toy import build_run, tiny_cfg, train


def _foreign_lock(root, pid: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / run_folder.LOCK_FILENAME).write_text(json.dumps({"pid": pid, "host": socket.gethostname(),
                                                             "started": "2026-12-01T09:00:00"}))


def test_second_writer_is_refused_naming_the_holder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _foreign_lock(tmp_path, holder.pid)
        run = build_run(tiny_cfg(save=str(tmp_path)))
        with pytest.raises(RunFolderLockedError, match=f"locked by pid {holder.pid} on host"):
            run.manager.save()
        assert not list(tmp_path.glob("iter_*"))
    finally:
        holder.kill()
        holder.wait()


def test_stale_lock_is_taken_over(tmp_path, caplog):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _foreign_lock(tmp_path, dead.pid)
    run = build_run(tiny_cfg(save=str(tmp_path)))
    with caplog.at_level("WARNING"):
        run.manager.save()
    assert "taking over the stale lock" in caplog.text
    assert json.loads((tmp_path / run_folder.LOCK_FILENAME).read_text())["pid"] == os.getpid()
    run.manager.close()
    assert not (tmp_path / run_folder.LOCK_FILENAME).exists()  # released at close


def test_new_run_does_not_overwrite_another_runs_checkpoints(tmp_path):
    first = build_run(tiny_cfg(save=str(tmp_path)))
    train(first, 3)
    first.manager.save()
    first.manager.close()
    fresh = build_run(tiny_cfg(save=str(tmp_path)), seed=1)  # no checkpoint.load: a new run
    with pytest.raises(CheckpointOverwriteError, match=r"already holds checkpoints of steps \[3\]"):
        fresh.manager.load()
    assert files.read_tracker_step(tmp_path) == 3
    fresh.manager.close()
    allowed = build_run(tiny_cfg(save=str(tmp_path), overwrite=True), seed=1)
    assert allowed.manager.load() is False
    assert files.list_checkpoints(tmp_path) == []  # deleted, as checkpoint.overwrite says
    train(allowed, 1)
    allowed.manager.save()
    assert files.read_tracker_step(tmp_path) == 1


def test_resuming_an_earlier_step_does_not_overwrite_later_ones(tmp_path):
    run = build_run(tiny_cfg(save=str(tmp_path)))
    for _ in range(2):
        train(run, 2)
        run.manager.save()
    run.manager.close()
    older = build_run(tiny_cfg(save=str(tmp_path), load=str(tmp_path), ckpt_step=2))
    with pytest.raises(CheckpointOverwriteError, match=r"resumed from step 2.*later steps \[4\]"):
        older.manager.load()
    same = build_run(tiny_cfg(save=str(tmp_path), load=str(tmp_path)))  # the normal resume: fine
    assert same.manager.load() and same.state.step == 4


@pytest.mark.parametrize("what", ["file", "other_folder"])
def test_load_path_that_is_not_a_checkpoint_is_an_error(tmp_path, what):
    target = tmp_path / "target"
    if what == "file":
        target.write_text("not a checkpoint")
        match = "is a file, not a checkpoint folder"
    else:
        target.mkdir()
        (target / "notes.txt").write_text("x")
        match = r"holds no checkpoint .* not empty: \['notes.txt'\]"
    with pytest.raises(CheckpointError, match=match):
        build_run(tiny_cfg(load=str(target))).manager.load()
    assert build_run(tiny_cfg(load=str(tmp_path / "missing"))).manager.load() is False  # first run: fresh


def test_interrupted_saves_are_removed_at_start_up(tmp_path):
    stale = files.temporary_dir(tmp_path, 5, "abc123def456")
    stale.mkdir(parents=True)
    (stale / "big.bin").write_bytes(b"x" * 1000)
    run = build_run(tiny_cfg(save=str(tmp_path), load=str(tmp_path)))
    assert run.manager.load() is False  # before any save
    assert not stale.exists()


def test_disk_full_before_the_save_is_a_named_error(tmp_path, monkeypatch):
    run = build_run(tiny_cfg(save=str(tmp_path)))
    train(run, 2)
    run.manager.save()
    train(run, 2)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(run_folder.shutil, "disk_usage", lambda path: usage._replace(free=1000))
    with pytest.raises(DiskFullError, match=rf"in {str(tmp_path)!r}: it needs about [\d,]+ bytes; 1,000 bytes"):
        run.manager.save()
    assert files.read_tracker_step(tmp_path) == 2 and files.list_checkpoints(tmp_path) == [2]


def test_disk_full_during_the_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    run = build_run(tiny_cfg(save=str(tmp_path)))
    train(run, 2)
    run.manager.save()
    train(run, 2)
    real_save = dcp.save

    def full_disk(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dcp, "save", full_disk)
    with pytest.raises(DiskFullError, match=rf"not enough disk space to save a checkpoint in {str(tmp_path)!r}"):
        run.manager.save()
    assert files.read_tracker_step(tmp_path) == 2
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []  # the failed save's folder is gone
    run.manager.close()
    monkeypatch.setattr(dcp, "save", real_save)  # space freed: a restart resumes and saves
    again = build_run(tiny_cfg(save=str(tmp_path), load=str(tmp_path)))
    assert again.manager.load() and again.state.step == 2
    train(again, 1)
    again.manager.save()
    assert files.read_tracker_step(tmp_path) == 3


@pytest.mark.parametrize("content", [b"", b"\xff\xfe garbage", b'{"host": "x"}'])
def test_empty_or_unreadable_lock_is_named_as_such(tmp_path, content):
    (tmp_path / run_folder.LOCK_FILENAME).write_bytes(content)
    with pytest.raises(RunFolderLockedError, match=r"has a lock file .*run.lock' that is empty or unreadable \(not a "
                       r"lock record .*\); its writer may have been killed while writing it. If no job writes to "
                       r"this folder, delete the file") as info:
        run_folder.acquire_lock(tmp_path)
    assert "pid None" not in str(info.value)
    assert (tmp_path / run_folder.LOCK_FILENAME).read_bytes() == content  # left for the user to judge


def test_run_refused_by_the_overwrite_check_leaves_no_lock(tmp_path):
    first = build_run(tiny_cfg(save=str(tmp_path)))
    train(first, 1)
    first.manager.save()
    first.manager.close()
    fresh = build_run(tiny_cfg(save=str(tmp_path)), seed=1)
    with pytest.raises(CheckpointOverwriteError):
        fresh.manager.load()
    assert not (tmp_path / run_folder.LOCK_FILENAME).exists()
