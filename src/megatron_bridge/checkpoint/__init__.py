"""Checkpoints: saving and resuming a run, and reading a saved one, in the engines' own formats; see
docs/training/checkpointing.md ("Where the code lives"). Conversion between formats lives a floor above, in
:mod:`megatron_bridge.bridge`, which imports this package and never the other way round.

* Save and resume: :class:`CheckpointManager` (``manager.py``, the one object the loop talks to), ``save.py``,
  ``files.py`` (the files of a checkpoint folder and its crash-safe commit), ``run_folder.py``, ``rng.py``, ``comm.py``,
  ``train_state.py``. The native engine's format is DCP (``torch.distributed.checkpoint``); the megatron-core
  engine's is megatron-core ``dist_checkpointing``: ``mcore_checkpoint.py`` (``torch_dist``), ``mcore_state.py``
  (its state dict, as Megatron-Bridge lays it out), ``mcore_megatron_fsdp.py`` and
  ``mcore_megatron_fsdp_preprocess.py`` (``fsdp_dtensor`` under Megatron FSDP), ``mcore_torch_fsdp2.py``
  (``torch_dist`` under PyTorch FSDP2).
* Reading a saved run: ``load.py`` (find, verify and load a checkpoint into a possibly resharded model), one reader
  per format: ``reader.py`` (DCP folders, ``torch`` files, weights files; never executing them), ``mcore_reader.py``
  (megatron-core ``torch_dist`` folders), ``mcore_megatron_fsdp.py`` (``fsdp_dtensor`` folders); ``saved_run.py``
  (what a folder's ``run_config.yaml`` says about the run that wrote it); ``converter.py`` (the protocol through
  which the loader asks the conversion floor for what it cannot read: a Hugging Face folder, a copy of the other
  engine's checkpoint in this engine's format); ``foreign.py`` (the other engine's checkpoints, converted on the fly
  or refused with the fix).
"""

from megatron_bridge.checkpoint.files import iteration_dir, list_checkpoints
from megatron_bridge.checkpoint.manager import CheckpointManager


__all__ = [
    "CheckpointManager",
    "iteration_dir",
    "list_checkpoints",
]
