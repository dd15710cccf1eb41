"""Skips the Bridge parity tests when transformers (a test dependency) is missing; quiets its progress bars."""

import os

import pytest

from megatron_bridge.distributed.init import groups_destroyed_after


os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _quiet_transformers():  # noqa: ANN202
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # the tests that need it import it and fail loudly
        yield
        return
    hf_logging.disable_progress_bar()
    yield


@pytest.fixture(autouse=True)
def _groups_of_the_test():
    """The process groups a test made (its runs' checkpoint managers, megatron-core's) end with it, where a default
    group outlives the test (tests/unit_tests/checkpoint/conftest.py says why)."""
    with groups_destroyed_after():
        yield
