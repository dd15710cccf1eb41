"""The Bridge's side of the checkpoint loader's :class:`megatron_bridge.checkpoint.converter.Converter`:
Hugging Face folders read under our names (:mod:`.pretrained`), and one engine's checkpoint written in the other's
format (:mod:`.cross_engine`). ``pretrain()`` hands a :class:`PretrainedConverter` to the ``CheckpointManager``."""

from collections.abc import Mapping
from pathlib import Path

import torch

from megatron_bridge.bridge.hf_reader import is_hf_folder
from megatron_bridge.bridge.pretrained import hf_weights_for_model
from megatron_bridge.config.model import ModelConfig


class PretrainedConverter:
    """The Bridge's side of :class:`megatron_bridge.checkpoint.converter.Converter` (module docstring)."""

    def is_hf_folder(self, path: Path) -> bool:
        """True for a Hugging Face model folder (``config.json`` and weights)."""
        return is_hf_folder(path)

    def hf_weights(self, path: str | Path, model_config: ModelConfig | None) -> Mapping[str, torch.Tensor]:
        """The folder's weights under our names: checked against ``model_config`` and padded for it (lazily) when
        given, else every tensor as stored (the folder's vocabulary rows)."""
        if model_config is not None:
            return hf_weights_for_model(path, model_config)
        from megatron_bridge.bridge.convert import read_hf_folder

        return read_hf_folder(path)

    def convert_for_engine(self, path: str, kind: str, model: ModelConfig, engine: str,
                           out_dir: Path) -> tuple[str, str]:
        """An exact copy of the source's model weights in ``engine``'s format under ``out_dir``: ``(path, kind)``."""
        from megatron_bridge.bridge.cross_engine import convert_for_engine

        return convert_for_engine(path, kind, model, engine, out_dir)
