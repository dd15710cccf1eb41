"""A save SIGKILLed at any stage leaves the previous latest checkpoint loadable; leftovers are ignored and cleaned."""

import os
import signal
import subprocess
import time
from pathlib import Path

import torch

from megatron_bridge.checkpoint import files
from tests.functional_tests.launcher import warm_python
from tests.unit_tests.checkpoint.toy import build_run, full_weights, tiny_cfg, train


REPO = Path(__file__).resolve().parents[3]

# (stage the save of step 2 is killed at, mode) -> the step a resume must load
CASES = {
    ("rank_files_written", "sync"): 1,  # temp folder with RNG files only
    ("shards_written", "sync"): 1,  # every shard durable, no manifest
    ("manifest_written", "sync"): 1,  # complete temp folder, not renamed
    ("renamed", "sync"): 1,  # iter_0000002 committed, trackers still at 1
    ("train_state_tracker", "sync"): 2,  # latest_train_state.pt at 2, the .txt tracker at 1
    ("trackers_written", "sync"): 2,  # both trackers at 2, cleanup not run
    ("shards_written", "async"): 1,  # async: the background commit killed
}


def _wait_and_kill(marker: Path, proc: subprocess.Popen, timeout: float = 120.0) -> str:
    """Wait until the case reports its pause (``"<stage> <pid>"``), SIGKILL that pid, return the stage."""
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            output = proc.communicate()[0].decode(errors="replace") if proc.poll() is not None else ""
            raise AssertionError(f"{marker.parent.name} never reached its pause point:\n{output[-3000:]}")
        time.sleep(0.05)
    stage, pid = marker.read_text().split()
    os.kill(int(pid), signal.SIGKILL)
    return stage


def test_sigkill_during_save_never_breaks_the_previous_checkpoint(tmp_path):
    case_dirs = {case: tmp_path / f"{case[0]}-{case[1]}" for case in CASES}
    for d in case_dirs.values():
        d.mkdir()
    python, env = warm_python()  # forked warm from the suite's fork server where it has one
    env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.Popen(
        [python, "-m", "tests.unit_tests.checkpoint.crash_child",
         *(f"{d}:{stage}:{mode}" for (stage, mode), d in case_dirs.items())],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        for (stage, _), case_dir in case_dirs.items():
            assert _wait_and_kill(case_dir / "reached", proc) == stage
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()

    for (stage, mode), case_dir in case_dirs.items():
        root, expected = case_dir / "ckpt", CASES[(stage, mode)]
        resumed = build_run(tiny_cfg(load=str(root), save=str(root)), seed=9)
        assert resumed.manager.load(), stage
        assert resumed.state.step == expected, (stage, mode)
        reference = torch.load(case_dir / f"ref_{expected}.pt", weights_only=True)
        assert all(torch.equal(reference[k], v) for k, v in full_weights(resumed).items()), (stage, mode)

        # The next save cleans up what the killed one left and becomes the latest.
        train(resumed, 1)
        resumed.manager.save()
        leftovers = [p.name for p in root.iterdir() if ".tmp-" in p.name or ".trash-" in p.name]
        assert leftovers == [], (stage, mode)
        assert files.read_tracker_step(root) == expected + 1, (stage, mode)
