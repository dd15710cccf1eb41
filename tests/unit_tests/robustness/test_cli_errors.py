"""Clean CLI errors: one line and exit code 2 for project errors, tracebacks only for crashes or with --debug, and
every script ends through ``run_cli``."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_bridge.distributed.failure import annotate_failure, is_peer_failure
from megatron_bridge.errors import ConfigValidationError, TrainingError
from megatron_bridge.utils.cli import (
    DEBUG_ENV,
    EXIT_CRASH,
    EXIT_INTERRUPTED,
    EXIT_PEER_FAILURE,
    EXIT_USER_ERROR,
    run_cli,
)


REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _no_debug_env():
    """run_cli(--debug) sets MEGATRON_BRIDGE_DEBUG for the process (so workers inherit it): reset around tests."""
    os.environ.pop(DEBUG_ENV, None)
    yield
    os.environ.pop(DEBUG_ENV, None)


def _raiser(exc: BaseException):  # noqa: ANN202
    def main(argv: list[str]) -> int:
        raise exc

    return main


def test_project_error_is_one_line_exit_2(capsys):
    assert run_cli(_raiser(ConfigValidationError("train.lr=-1 must be >= 0")), []) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err == "error: train.lr=-1 must be >= 0\n"


def test_training_error_is_a_user_error(capsys):
    assert run_cli(_raiser(TrainingError("the training loss is nan")), []) == EXIT_USER_ERROR
    assert "Traceback" not in capsys.readouterr().err


def test_debug_flag_shows_the_traceback_and_is_removed(capsys):
    seen = []

    def main(argv: list[str]) -> int:
        seen.append(argv)
        raise ConfigValidationError("bad value")

    assert run_cli(main, ["--debug", "x=1"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert seen == [["x=1"]]
    assert "Traceback" in err and "error: bad value" in err


def test_debug_env_var(capsys, monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert run_cli(_raiser(ConfigValidationError("bad value")), []) == EXIT_USER_ERROR
    assert "Traceback" in capsys.readouterr().err


def test_crash_keeps_its_traceback_and_exit_1(capsys):
    assert run_cli(_raiser(ZeroDivisionError("division by zero")), []) == EXIT_CRASH
    assert "Traceback" in capsys.readouterr().err


def test_keyboard_interrupt_and_usage_errors(capsys):
    assert run_cli(_raiser(KeyboardInterrupt()), []) == EXIT_INTERRUPTED
    assert run_cli(_raiser(SystemExit(2)), []) == 2
    assert run_cli(lambda: 0) == 0  # a main() without arguments


def test_peer_failure_is_recognised_and_annotated(capsys):
    exc = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:31147. This is typically caused by ...")
    assert is_peer_failure(exc)
    assert not is_peer_failure(ValueError("Connection closed by peer"))  # only gloo's RuntimeErrors
    annotate_failure(exc, rank=0, world_size=2)
    assert exc.rank == 0 and exc.peer_failure
    assert run_cli(_raiser(exc), []) == EXIT_PEER_FAILURE
    err = capsys.readouterr().err
    assert err.startswith("stopped (rank 0): another rank failed") and "Connection closed by peer" in err
    assert "Traceback" not in err


def test_rank_is_named_for_distributed_errors(capsys):
    exc = ConfigValidationError("bad")
    annotate_failure(exc, rank=1, world_size=2)
    assert run_cli(_raiser(exc), []) == EXIT_USER_ERROR
    assert capsys.readouterr().err == "error (rank 1): bad\n"


SCRIPTS = sorted(p for p in (REPO / "scripts").rglob("*.py") if not p.name.startswith("_"))
"""Every entry point (a module that scripts share, named ``_*.py``, is not one)."""


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(p.relative_to(REPO)) for p in SCRIPTS])
def test_every_script_ends_through_run_cli(script):
    text = script.read_text()
    assert "sys.exit(run_cli(main))" in text, f"{script} does not end with sys.exit(run_cli(main))"


def test_run_recipe_config_error_is_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts/training/run_recipe.py"), "--recipe", "tiny_llama", "--dry-run",
         "train.no_such_key=1"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == EXIT_USER_ERROR, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: unknown config key 'train.no_such_key'")


def test_messages_name_the_node_in_a_job_over_several_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron_bridge.distributed.failure import annotate_failure
    from megatron_bridge.utils.cli import describe

    exc = ConfigValidationError("bad value")
    annotate_failure(exc, 3, 4)
    assert describe(exc)[0] == "error (rank 3): bad value"  # one node: as before
    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    assert describe(exc)[0] == "error (rank 3, node 1): bad value"
    other = RuntimeError("boom")
    annotate_failure(other, 3, 4)
    assert "(raised on rank 3 of 4, node 1)" in other.__notes__
