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


class _ClosedNode:
    """A worker whose channel closed after its last report (it crashed): every send fails, as execnet's does."""

    shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        raise OSError("cannot send (already closed?)")

    def shutdown(self) -> None:
        raise AssertionError("a worker still holding unfinished tests is not told to shut down")


def test_work_sent_to_a_worker_that_crashed_after_its_report_goes_back_on_the_queue() -> None:
    """The report of the test before the crash is handled first: the unit sent then stays with the crashed worker,
    and removing the worker puts it back on the queue, the crashed test still named as such."""
    from collections import OrderedDict
    from types import SimpleNamespace

    from tests.xdist_recovery import crash_safe_scope_scheduling

    sched = crash_safe_scope_scheduling()(SimpleNamespace(getvalue=lambda name: ["popen", "popen"]))
    node = _ClosedNode()
    crashing = {"t8.py::before": True, "t8.py::crash": False, "t8.py::after": False}
    sched.assigned_work[node] = {"t8.py": crashing}
    sched.registered_collections[node] = ["t8.py::before", "t8.py::crash", "t8.py::after", "t9.py::a"]
    sched.workqueue = OrderedDict({"t9.py": {"t9.py::a": False}})
    sched._reschedule(node)  # no exception: the run goes on to the crash report
    assert not sched.workqueue and sched.assigned_work[node]["t9.py"] == {"t9.py::a": False}
    assert sched.remove_node(node) == "t8.py::crash"
    assert list(sched.workqueue) == ["t8.py", "t9.py"] and sched.workqueue["t8.py"]["t8.py::crash"] is True
