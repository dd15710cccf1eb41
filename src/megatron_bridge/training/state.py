"""``TrainState`` and ``GlobalState`` under Megatron-Bridge's import path (``megatron.bridge.training.state``).

``TrainState`` lives in :mod:`megatron_bridge.checkpoint.train_state`, beside the checkpoints that save and restore
it. ``GlobalState`` is :class:`megatron_bridge.training.pretrain.TrainingContext`, the one training state object
here: what a forward step that takes the state gets (``state.cfg``, ``state.train_state``, ``state.timers``, ...);
it is built by ``pretrain()``, not by ``GlobalState()`` and assignments as there.
"""

from megatron_bridge.checkpoint.train_state import TrainState
from megatron_bridge.training.pretrain import TrainingContext as GlobalState


__all__ = ["GlobalState", "TrainState"]
