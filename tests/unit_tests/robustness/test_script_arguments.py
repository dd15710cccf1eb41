"""Script arguments a user may reasonably type (issue 45, item 7): a flag between the ``key=value`` overrides is read
as a flag (run_recipe.py, launch.py), and a ``--data-cache`` under a file is one ``error:`` line."""

from pathlib import Path

import pytest

from megatron_bridge.utils.cli import EXIT_USER_ERROR, run_cli
from tests.unit_tests.scripts import load_script


_script = load_script


def test_run_recipe_reads_a_flag_between_overrides() -> None:
    args = _script("scripts/training/run_recipe.py").parse_args(
        ["--recipe", "tiny_llama", "train.train_iters=2", "--dry-run", "optimizer.lr=1e-3", "--nproc", "2",
         "train.micro_batch_size=1"])
    assert args.dry_run and args.nproc == 2
    assert args.overrides == ["train.train_iters=2", "optimizer.lr=1e-3", "train.micro_batch_size=1"]


def test_launch_reads_a_flag_between_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli(_script("scripts/performance/launch.py").main,
                   ["--recipe", "tiny_llama", "train.train_iters=3", "--dryrun", "optimizer.lr=0.0125"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "train_iters: 3" in out and "lr: 0.0125" in out


def test_run_recipe_data_cache_under_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("a regular file")
    code = run_cli(_script("scripts/training/run_recipe.py").main,
                   ["--recipe", "tiny_llama", "--corpus", "--data-cache", str(a_file / "cache"), "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USER_ERROR
    assert err == [f"error: corpus cache folder '{a_file}/cache' cannot be written: '{a_file}' is a file, not a "
                   "folder, so nothing can be created under it; choose another folder (--data-cache)"]
    assert a_file.read_text() == "a regular file"
