"""Megatron-Bridge's import path for the config classes: ``from megatron_bridge.training.config import ...``.

The classes live in :mod:`megatron_bridge.config` (the package's lowest floor, free of torch); this module
re-exports them so scripts ported from Megatron-Bridge import unchanged.
"""

from megatron_bridge.config import *  # noqa: F403
from megatron_bridge.config import __all__  # noqa: F401
