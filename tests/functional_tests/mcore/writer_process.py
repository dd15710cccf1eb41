"""Test-only: stop the multiprocessing manager process megatron-core's ``torch_dist`` writer starts at a worker's first
save (the results queue of ``filesystem_async``), so a launch ends when its workers do.

``pretrain()`` stops it itself (``CheckpointManager.close``/``abandon`` call
:func:`megatron_bridge.checkpoint.mcore_checkpoint.stop_writer_processes`); test workers that save through lower-level
calls, and end with ``os._exit`` (conftest.py), would leave it running and holding the launch's output pipe open until
it notices (minutes). Import the fixture into a test module that saves megatron-core checkpoints.
"""

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module", autouse=True)
def stop_megatron_core_writer_process() -> Iterator[None]:
    """Worker: at the end of the module, shut megatron-core's writer manager down (if one was started)."""
    yield
    from megatron_bridge.checkpoint.mcore_checkpoint import stop_writer_processes

    stop_writer_processes()
