"""tests/session_watchdog.py: a session past ``$MB_SESSION_LIMIT_S`` ends with exit code 3 and names the tests still
running and the process table, with and without pytest-xdist."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.functional_tests.launcher import REPO_ROOT
from tests.session_watchdog import EXIT_CODE, LIMIT_ENV


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["one process", "xdist"])
def test_a_session_past_its_limit_ends_and_names_what_still_runs(tmp_path: Path, workers: list[str]) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.session_watchdog"]\n')
    (tmp_path / "test_stuck.py").write_text("import time\n\ndef test_quick():\n    pass\n\n"
                                            "def test_stuck():\n    time.sleep(120)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), LIMIT_ENV: "4"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *workers, str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
    err = proc.stderr
    assert proc.returncode == EXIT_CODE, proc.stdout[-2000:] + err[-2000:]
    assert "the test session ran past 4 s" in err, err[-2000:]
    stuck = [line for line in err.splitlines() if "test_stuck.py::" in line]
    assert len(stuck) == 1 and "test_stuck.py::test_stuck (for" in stuck[0], err[-2000:]  # test_quick finished
    assert "Processes:" in err and "PID" in err, err[-2000:]
