"""Conversion between formats, the library's one home for it: Hugging Face folders in and out (the Bridge,
``AutoBridge``), exact, for every model family we ship; one engine's checkpoints as the other's; weights files.
It sits above ``checkpoint/`` (save/resume, the engines' own formats) and imports it, never the other way round.

``from megatron_bridge import AutoBridge`` (lazy) or ``from megatron_bridge.bridge import AutoBridge``. Modules:

| module | concern |
|---|---|
| ``auto_bridge.py`` | :class:`AutoBridge`, Megatron-Bridge's entry points |
| ``provider.py`` | ``GPTModelProvider``: a ``ModelConfig`` with Megatron-Bridge's ``finalize`` /
  ``provide_distributed_model`` |
| ``model_files.py`` | model-only checkpoint run configs, HF weights-only files, the per-parameter conversion tasks |
| ``families/`` | one mapping module per family (config both ways, weight names) and the registry |
| ``rope.py`` | RoPE base and scaling in both transformers config formats |
| ``hf_reader.py`` / ``hf_writer.py`` | HF weight files in; sharded safetensors + index out, streamed |
| ``config_out.py`` | the exported ``config.json``: the source's own file, changed only where the model differs |
| ``weights.py`` | name mapping, vocabulary (un)padding, checks of missing/unknown/mis-shaped tensors |
| ``convert.py`` / ``targets.py`` | the entry points of ``scripts/checkpoint/convert.py``: any source to any format;
  the formats it writes (torch-free, for the command line) |
| ``engine_checkpoints.py`` | native weights ⇄ megatron-core ``torch_dist`` checkpoints (one process, CPU) |
| ``checkpoints.py`` | our checkpoints, read tensor by tensor; streamed native ``torch_dist`` writing (also of a live
  model's weights, ``save_megatron_model``) |
| ``exporting.py`` / ``assets.py`` | the HF folder an export writes; tokenizer, generation config, token ids |
| ``pretrained.py`` | ``checkpoint.pretrained_checkpoint`` = HF folder: config check against ``cfg.model`` |
| ``converter.py`` / ``cross_engine.py`` | the checkpoint loader's ``Converter``; other engine's checkpoints |
| ``model_io.py`` / ``output.py`` / ``memory.py`` | model fill/read, all-or-nothing output folders, memory meter |
"""

import importlib
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from megatron_bridge.bridge.auto_bridge import AutoBridge
    from megatron_bridge.bridge.convert import convert_weights, read_model_weights, write_hf_folder, write_torch_weights
    from megatron_bridge.bridge.families import ModelFamily, family_names, supported_architectures
    from megatron_bridge.bridge.hf_reader import is_hf_folder

_EXPORTS = {"AutoBridge": "auto_bridge", "convert_weights": "convert", "read_model_weights": "convert",
            "write_hf_folder": "convert", "write_torch_weights": "convert", "ModelFamily": "families",
            "family_names": "families", "supported_architectures": "families", "is_hf_folder": "hf_reader"}
"""Name → the module of this package that defines it: imported on first use, so importing a light submodule (e.g.
``targets`` for a command line's ``--help``) does not import torch."""

__all__ = ["AutoBridge", "ModelFamily", "convert_weights", "family_names", "is_hf_folder", "read_model_weights",
           "supported_architectures", "write_hf_folder", "write_torch_weights"]


def __getattr__(name: str) -> object:
    """The names of ``__all__``, each imported from its module on first use."""
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
