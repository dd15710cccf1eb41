"""tests/xdist_recovery.py: under ``make test``'s scheduling (tests/conftest.py, ``-n N --dist loadgroup``) a crashed
xdist worker fails the test it crashed on and the run goes on to its end; with pytest-xdist 3.8.0's own scope
scheduling the same run never ends (checked when this test was written: it still hung after 60 s)."""

import os
import subprocess
import sys
from pathlib import Path

from tests.functional_tests.launcher import REPO_ROOT


CONFTEST = """
import pytest

@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from tests.conftest import _xdist_scheduler

    config.option.loadscopereorder = False
    return _xdist_scheduler()(config, log)
"""

CRASHING = """
import os, pathlib

def test_before():
    pass

def test_crash():
    mark = pathlib.Path(os.environ["XR_MARK"])
    assert not mark.exists(), "the test a worker crashed on ran again"
    mark.write_text("crashed once")
    os._exit(1)

def test_after():
    pass
"""


def test_a_crashed_worker_fails_its_test_and_the_run_ends(tmp_path: Path) -> None:
    # The crash comes after the worker completed other files: xdist 3.8.0 queues those again as empty units and hangs.
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for i in range(1, 13):
        (tmp_path / f"test_{i:02d}.py").write_text("import time\n\ndef test_a():\n    time.sleep(0.2)\n\n"
                                                   "def test_b():\n    time.sleep(0.2)\n")
    (tmp_path / "test_08.py").write_text(CRASHING)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "XR_MARK": str(tmp_path / "mark")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
                           "-q", "-rf", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-2000:]
    assert "crashed while running 'test_08.py::test_crash'" in out, out[-3000:]
    assert "1 failed, 24 passed" in out, out[-3000:]  # 11 files x 2 + test_before + test_after, the crash not rerun
