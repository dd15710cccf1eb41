"""megatron-bridge: a pretraining library for large language models that runs on CPU and GPU.

Importing the package is cheap: heavy modules (the training loop, distributed backends, megatron-fsdp) are only
imported by the submodules that need them.
"""

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``megatron_bridge.AutoBridge``, imported on first use (the package import stays light)."""
    if name == "AutoBridge":
        from megatron_bridge.bridge import AutoBridge

        return AutoBridge
    raise AttributeError(f"module 'megatron_bridge' has no attribute {name!r}")
