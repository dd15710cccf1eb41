"""Training utilities at Megatron-Bridge's import paths (``megatron.bridge.training.utils``)."""
