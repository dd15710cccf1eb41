"""The formats a conversion writes (``scripts/checkpoint/convert.py --to``); torch-free, so a command line lists them
without importing torch."""

TARGETS = ("torch", "hf", "megatron", "megatron_core")
"""What :func:`megatron_bridge.bridge.convert.convert_weights` writes: a torch file, a HF folder, one of our (native
engine) checkpoints, a megatron-core torch_dist checkpoint (the megatron-core engine's;
:mod:`megatron_bridge.bridge.engine_checkpoints`)."""
