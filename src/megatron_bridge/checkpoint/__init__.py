"""Checkpoint save, resume and conversion (torch.distributed.checkpoint based; see docs/training/checkpointing.md).

The training loop uses :class:`CheckpointManager`; :mod:`~megatron_bridge.checkpoint.convert` exports and imports
full weights (a ``torch`` file, a Hugging Face Llama folder).
"""

from megatron_bridge.checkpoint.convert import convert_weights, read_model_weights, write_hf_folder, write_torch_weights
from megatron_bridge.checkpoint.layout import iteration_dir, list_checkpoints
from megatron_bridge.checkpoint.manager import CheckpointManager


__all__ = [
    "CheckpointManager",
    "convert_weights",
    "iteration_dir",
    "list_checkpoints",
    "read_model_weights",
    "write_hf_folder",
    "write_torch_weights",
]
