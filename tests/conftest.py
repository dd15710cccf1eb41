"""Suite-wide settings: no GPU tests without CUDA, one thread per process (2-core machines), and under pytest-xdist
(``make test`` runs ``pytest tests -n 2 --dist loadgroup``) the functional tests in one serial stream."""

import os
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling


os.environ.setdefault("OMP_NUM_THREADS", "1")

FUNCTIONAL_PREFIX = "tests/functional_tests/"
FUNCTIONAL_GROUP = "functional"
"""The one unit of work of the tests under :data:`FUNCTIONAL_PREFIX` (``--dist loadgroup``)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` when no CUDA device is present."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class FunctionalStream(LoadScopeScheduling):
    """xdist scheduling of ``--dist loadgroup`` here: every functional test in one unit of work, so one worker runs
    them one at a time in the order collected (a file's tests share its module fixtures and torchrun launches; no two
    launches compete for the cores) while the other worker runs the unit tests beside them, a file at a time.

    xdist's own loadgroup reads ``xdist_group`` marks into the node ids, which pytest 9 no longer lets a plugin
    rename: it would split a file's tests over both workers."""

    def _split_scope(self, nodeid: str) -> str:
        return FUNCTIONAL_GROUP if nodeid.startswith(FUNCTIONAL_PREFIX) else nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    """:class:`FunctionalStream` for ``--dist loadgroup`` (``make test``), its units in collection order (the
    functional stream, the longest, first); xdist's own for the other modes."""
    if config.getvalue("dist") != "loadgroup":
        return None
    config.option.loadscopereorder = False
    return FunctionalStream(config, log)
