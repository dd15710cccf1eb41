"""``TrainState`` under Megatron-Bridge's import path (``megatron.bridge.training.state``); it lives in
:mod:`megatron_bridge.checkpoint.train_state`, beside the checkpoints that save and restore it."""

from megatron_bridge.checkpoint.train_state import TrainState


__all__ = ["TrainState"]
