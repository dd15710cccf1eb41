"""Worker-side teardown and per-test reports for tests launched under torch.distributed.run (see launcher.py)."""

import json
import os
import signal
import sys

import pytest

from tests.functional_tests import deferred_compile
from tests.functional_tests.launcher import (
    DEADLINE_MARGIN_S,
    REPORT_ENV,
    SHARED_LAUNCHES,
    is_worker,
    set_test_deadline,
)


if is_worker():  # before a test module imports megatron-core (deferred_compile.py says why)
    deferred_compile.install()
    import torch

    # A crash (SIGSEGV, SIGBUS, SIGABRT, ...) prints every thread's C++ stack before Python's own report (launcher.py's
    # fatal_errors quotes the crashed thread's); torch's handler then hands the signal on to faulthandler's. SIGINT,
    # which torch's handler takes too, goes back to Python's handler (KeyboardInterrupt, without stacks).
    _python_sigint = signal.getsignal(signal.SIGINT)
    torch._C._set_print_stack_traces_on_fatal_signal(True)
    if _python_sigint is not None:
        signal.signal(signal.SIGINT, _python_sigint)

_EXIT_STATUS: list[int] = []
_FAILED: set[str] = set()
"""Node ids of the tests that failed on this rank (a phase's report said so)."""


@pytest.fixture(autouse=True)
def _teardown_process_group(request: pytest.FixtureRequest):
    """After each test on a torchrun worker: barrier, then destroy the process group if the test left one.

    In a shared launch (``$MB_CASE_REPORT`` set, launcher.py's ``launch_cases``) the tests share one process group,
    which they join with ``init_process_group`` and leave alive (a default group re-created after
    ``destroy_process_group`` on torchrun's store can hang): it stays up for the next test. A test that passed without
    leaving a group made and destroyed its own through ``pretrain()`` (megatron_bridge.distributed.init joins a second
    and later group under a fresh store prefix, so the next test may do so again). If a test failed without it
    (pretrain() aborted it after the failure), the launch stops: the remaining tests are reported as not run.
    """
    yield
    if not is_worker():
        return
    import torch.distributed as dist

    if os.environ.get(REPORT_ENV):
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
            return
        if request.node.nodeid in _FAILED:
            pytest.exit("this shared launch's process group is gone (a test failed and aborted it): the remaining "
                        "tests cannot run", returncode=1)
        return
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Launching process: every test of a shared launch (launcher.py's ``SHARED_LAUNCHES``) gets that launch's
    timeout plus :data:`DEADLINE_MARGIN_S` as its pytest-timeout, as whichever of them runs first waits for all."""
    if is_worker():
        return
    for shared in SHARED_LAUNCHES:
        members = set(shared.tests)
        for item in items:
            if item.nodeid in members:
                item.add_marker(pytest.mark.timeout(shared.timeout + DEADLINE_MARGIN_S))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Launching process: the test's launches end before its pytest-timeout would stop it (which counts from here,
    fixture set-up included), so the launcher reports a hung launch test by test (launcher.py)."""
    if not is_worker():
        set_test_deadline(_pytest_timeout(item))


def _pytest_timeout(item: pytest.Item) -> float | None:
    """pytest-timeout's limit for ``item``: its ``timeout`` marker, else ``--timeout``, else the ini value."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    else:
        value = item.config.getoption("timeout", None) or item.config.getini("timeout")
    return float(value) if value else None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """On a worker of a shared launch (``$MB_CASE_REPORT`` set): append this rank's outcome of each test phase to
    ``rank<RANK>.jsonl`` there, so the launching process reports every test on its own."""
    folder = os.environ.get(REPORT_ENV)
    if not folder or not is_worker():
        return
    if report.failed:
        _FAILED.add(report.nodeid)
    detail = ""
    if report.failed:
        detail = str(report.longrepr)[-4000:]
    elif report.skipped and isinstance(report.longrepr, tuple):
        detail = str(report.longrepr[2])
    row = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
           "detail": detail}
    with open(os.path.join(folder, f"rank{os.environ.get('RANK', '0')}.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remember pytest's exit status for pytest_unconfigure."""
    _EXIT_STATUS.append(int(exitstatus))


def pytest_unconfigure(config: pytest.Config) -> None:
    """End torchrun workers with os._exit after the summary was printed (avoids gloo's teardown abort)."""
    if is_worker() and _EXIT_STATUS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
