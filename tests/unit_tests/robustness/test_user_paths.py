"""Paths given by the user are checked before anything runs (issue 27 item 8): an output under a regular file, in
/proc, or a results file that is not one is one ``error: ...`` line naming the path and why, exit code 2, from
run_recipe.py (``--dir``, any output field), launch.py (``--output_dir``, ``--compare``) and convert.py."""

import json
from pathlib import Path

import pytest

from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.recipes import tiny_llama_pretrain_config
from megatron_bridge.utils.cli import EXIT_USER_ERROR, run_cli
from tests.unit_tests.scripts import load_script


_script = load_script


def _error_line(script: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = run_cli(_script(script).main, argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USER_ERROR, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("a regular file")
    return path


def test_run_recipe_dir_under_a_file(a_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _error_line("scripts/training/run_recipe.py", ["--recipe", "tiny_llama", "--dry-run", "--dir",
                                                          str(a_file / "run")], capsys)
    assert line == f"error: --dir='{a_file}/run' cannot be written: '{a_file}' is a file, not a folder, so nothing " \
                   "can be created under it"


@pytest.mark.parametrize(("override", "why"), [("checkpoint.save=/proc/self/ckpt", "it is in /proc, a kernel file "
                                                "system"),
                                               ("logger.tensorboard_dir={file}", "it is a file, not a folder")])
def test_run_recipe_output_field_in_proc_or_a_file(override: str, why: str, a_file: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    override = override.format(file=a_file)
    line = _error_line("scripts/training/run_recipe.py", ["--recipe", "tiny_llama", "--dry-run", override], capsys)
    assert why in line and "[rule output_paths]" in line and override.split("=")[1] in line


def test_output_paths_rule_accepts_new_folders(tmp_path: Path) -> None:
    cfg = tiny_llama_pretrain_config(dir=str(tmp_path / "not" / "yet" / "there"))
    cfg.validate(world_size=1)
    cfg.checkpoint.save = "/sys/kernel/x"
    with pytest.raises(ConfigValidationError, match=r"checkpoint.save='/sys/kernel/x' cannot be written: it is in "
                       r"/sys"):
        cfg.validate(world_size=1)


@pytest.mark.parametrize("where", ["/proc/self/out", "{file}/out"])
def test_launch_output_dir(where: str, a_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    where = where.format(file=a_file)
    line = _error_line("scripts/performance/launch.py", ["-m", "llama", "-mr", "llama3_8b", "--dryrun",
                                                         "--output_dir", where], capsys)
    assert line.startswith(f"error: --output_dir='{where}' cannot be written: ")


@pytest.mark.parametrize(("make", "why"), [
    (lambda d: d / "missing.json", "cannot be read: it does not exist"),
    (lambda d: d, "cannot be read: it is a folder"),
    (lambda d: _write(d / "notes.txt", "plain text"), "is not a results file (not JSON"),
    (lambda d: _write(d / "other.json", json.dumps({"name": "x"})), "is not a results file: it has none of"),
])
def test_launch_compare_needs_results_files(make, why: str, tmp_path: Path,  # noqa: ANN001
                                            capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path / "results.json", json.dumps({"median_step_time_s": 1.0, "final_loss": 2.0}))
    bad = make(tmp_path)
    line = _error_line("scripts/performance/launch.py", ["--compare", str(good), str(bad)], capsys)
    assert line.startswith(f"error: --compare='{bad}' ") and why in line


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_convert_output_under_a_file(a_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _error_line("scripts/checkpoint/convert.py", [str(tmp_path), str(a_file / "hf"), "--to", "hf"], capsys)
    assert line == f"error: dst='{a_file}/hf' cannot be written: '{a_file}' is a file, not a folder, so nothing can " \
                   "be created under it"
