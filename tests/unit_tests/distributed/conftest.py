"""One in-process (1-rank, gloo) default process group for the distributed unit tests."""

import pytest

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.distributed.init import destroy_distributed, initialize_distributed


@pytest.fixture(scope="session", autouse=True)
def process_group():
    """The 1-process group ``initialize_distributed`` creates outside torchrun; destroyed at the end."""
    cfg = ConfigContainer()
    cfg.dist.distributed_backend = "gloo"  # CPU tests, also on a machine with CUDA
    env = initialize_distributed(cfg)
    yield env
    destroy_distributed()
