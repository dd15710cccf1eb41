"""Checkpoints: saving and resuming a run, reading a saved one, and (still here) converting weights; see
docs/training/checkpointing.md ("Where the code lives").

* Save and resume: :class:`CheckpointManager` (``manager.py``, the one object the loop talks to), ``save.py``,
  ``layout.py`` (the folder layout and its crash-safe commit), ``run_folder.py``, ``rng.py``, ``comm.py``,
  ``train_state.py``; the native engine's format is DCP (torch.distributed.checkpoint), the megatron-core engine's
  is megatron-core ``dist_checkpointing``: ``mcore_checkpoint.py`` (``torch_dist``), ``mcore_state.py`` (its state
  dict, as Megatron-Bridge lays it out), ``mcore_megatron_fsdp.py`` and ``mcore_megatron_fsdp_preprocess.py``
  (``fsdp_dtensor`` under Megatron FSDP), ``mcore_torch_fsdp2.py`` (``torch_dist`` under PyTorch FSDP2).
* Reading a saved run: ``load.py`` (find, verify and load a checkpoint into a possibly resharded model),
  ``reader.py`` (files and DCP metadata, never executing them), ``mcore_reader.py`` (megatron-core ``torch_dist``
  folders), ``saved_run.py`` (what a folder says about the run that wrote it).
* Conversion: ``convert.py`` (full weights ⇄ a ``torch`` file or a Hugging Face folder) and ``mcore_convert.py``
  (between the engines' checkpoints); they still import the Bridge (docs/architecture.md lists the cycle).
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
