"""One in-process (1-rank, gloo) default process group for the checkpoint unit tests (as ddp_wrap would create)."""

import warnings

import pytest
import torch.distributed as dist

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.distributed.init import destroy_distributed, groups_destroyed_after, initialize_distributed


@pytest.fixture(scope="package", autouse=True)
def process_group():
    """The 1-process group ``initialize_distributed`` creates outside torchrun, destroyed after this package's
    tests (so later tests see no group); a group that already existed is left alone."""
    existed = dist.is_initialized()
    env = initialize_distributed(ConfigContainer())
    yield env
    if not existed:
        destroy_distributed()


@pytest.fixture(autouse=True)
def _quiet_dcp_warnings():
    """DCP warns about overwriting / single-process use; the tests check behaviour, not those warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


@pytest.fixture(autouse=True)
def _groups_of_the_test():
    """The groups a test made (its checkpoint managers', megatron-core's) end with it: this package's group lives on,
    and each gloo group's thread would wake every 10 ms for the rest of the session."""
    with groups_destroyed_after():
        yield
