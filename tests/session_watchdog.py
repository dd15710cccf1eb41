"""Test-only pytest plugin: a test session that outlives its limit ends itself, saying what was still running.

pytest-timeout stops a test that runs too long, but not a session that stops making progress between tests (a
scheduler deadlock: tests/xdist_recovery.py) or a test whose timer cannot fire (a C call that never returns to
Python). CI then kills the run at its own limit (90 minutes) and shows only the end of the output, which named
nothing (a CI run of this suite: four tests short of the end, then killed). Here the controlling pytest process (the
only one under ``-n 0``, pytest-xdist's controller otherwise) starts a watchdog thread: after ``$MB_SESSION_LIMIT_S``
seconds (default :data:`LIMIT_S`) it writes the tests started and not finished, the seconds since the last report,
and the process table to standard error, and ends the session with exit code :data:`EXIT_CODE`. Test:
tests/unit_tests/env/test_session_watchdog.py.
"""

import os
import subprocess
import sys
import threading
import time

import pytest

from tests.functional_tests.launcher import is_worker


LIMIT_ENV = "MB_SESSION_LIMIT_S"
LIMIT_S = 3600.0
"""The whole suite takes 8-14 minutes on a 2-core machine (docs/testing.md); CI allows 90 with its set-up."""
EXIT_CODE = 3
"""pytest's own code for an internal error: the session did not complete."""

_running: dict[str, float] = {}
_last_report = [time.monotonic()]


def _controlling(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput") and not is_worker()


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _controlling(session.config):
        return
    limit = float(os.environ.get(LIMIT_ENV) or LIMIT_S)
    threading.Thread(target=_watch, args=(session.config, limit), daemon=True, name="session-watchdog").start()


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _running[nodeid] = time.monotonic()
    _last_report[0] = time.monotonic()


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    _running.pop(nodeid, None)
    _last_report[0] = time.monotonic()


def _watch(config: pytest.Config, limit_s: float) -> None:
    time.sleep(limit_s)
    now = time.monotonic()
    lines = [f"\nsession watchdog: the test session ran past {limit_s:.0f} s ({LIMIT_ENV}); the last test report came "
             f"{now - _last_report[0]:.0f} s ago. Tests started and not finished:"]
    lines += [f"  {nodeid} (for {now - start:.0f} s)" for nodeid, start in sorted(_running.items())] or ["  none"]
    try:
        table = subprocess.run(["ps", "-eo", "pid,ppid,pgid,stat,etime,time,args"], capture_output=True, text=True,
                               timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        table = f"(ps failed: {exc})"
    lines += ["Processes:", *(row[:220] for row in table.splitlines())]
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=True)  # the real standard error, not pytest's capture of it
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()
    os._exit(EXIT_CODE)
