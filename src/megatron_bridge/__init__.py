"""megatron-bridge: a pretraining library for large language models that runs on CPU and GPU.

Importing the package is cheap: heavy modules (the training loop, distributed backends, megatron-fsdp) are only
imported by the submodules that need them.
"""

__version__ = "0.1.0"
