"""Test-only: stop the multiprocessing manager process megatron-core's ``torch_dist`` writer starts at a worker's first
save (the results queue of ``filesystem_async``), so a launch ends when its workers do.

A normal interpreter exit stops it (atexit), but conftest.py ends workers with ``os._exit``; the manager would then
outlive its worker and hold the launch's output pipe open until it notices (minutes). Import the fixture into a test
module that saves megatron-core checkpoints.
"""

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module", autouse=True)
def stop_megatron_core_writer_process() -> Iterator[None]:
    """Worker: at the end of the module, shut megatron-core's writer manager down (if one was started)."""
    yield
    module = sys.modules.get("megatron.core.dist_checkpointing.strategies.filesystem_async")
    queue = getattr(module, "_results_queue", None)
    if queue is not None and getattr(queue, "_manager", None) is not None:
        queue._manager.shutdown()
        module._results_queue = None  # type: ignore[union-attr]
