"""Worker-side teardown for tests launched under torch.distributed.run (see launcher.py)."""

import os
import sys

import pytest

from tests.functional_tests.launcher import is_worker


_EXIT_STATUS: list[int] = []


@pytest.fixture(autouse=True)
def _teardown_process_group():
    """After each test on a torchrun worker: barrier, then destroy the process group if the test left one."""
    yield
    if not is_worker():
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remember pytest's exit status for pytest_unconfigure."""
    _EXIT_STATUS.append(int(exitstatus))


def pytest_unconfigure(config: pytest.Config) -> None:
    """End torchrun workers with os._exit after the summary was printed (avoids gloo's teardown abort)."""
    if is_worker() and _EXIT_STATUS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
