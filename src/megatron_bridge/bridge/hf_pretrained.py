"""Megatron-Bridge's ``bridge.hf_pretrained`` (its ``PreTrainedCausalLM``) over a local Hugging Face folder.

Its examples read ``bridge.hf_pretrained.state[name]`` (a HF weight by its HF name, to compare with an export) and
``bridge.hf_pretrained.tokenizer``; ``config`` and ``model`` are there too. Everything is read lazily from the folder
the bridge was made from; nothing is downloaded and no code in the folder is executed.
"""

from collections.abc import Iterator, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from megatron_bridge.bridge.hf_reader import HFWeightsReader


class HFState(Mapping[str, torch.Tensor]):
    """The folder's weights by HF name (``state["model.norm.weight"]``), each read when asked for."""

    def __init__(self, folder: Path) -> None:
        self._reader = HFWeightsReader(folder)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._reader.weight_map:
            raise KeyError(name)
        return self._reader.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._reader.names())

    def __len__(self) -> int:
        return len(self._reader.weight_map)


class PreTrainedCausalLM:
    """A local HF causal-LM folder as Megatron-Bridge's ``hf_pretrained``: ``state``, ``config``, ``tokenizer``,
    ``model`` (``transformers``' model, loaded on first use) and ``model_name_or_path``."""

    def __init__(self, folder: str | Path) -> None:
        self.model_name_or_path = str(folder)
        self._folder = Path(folder)

    @cached_property
    def state(self) -> HFState:
        """The weights by HF name."""
        return HFState(self._folder)

    @cached_property
    def config(self) -> Any:
        """``transformers``' config of the folder."""
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(self._folder, trust_remote_code=False)

    @cached_property
    def tokenizer(self) -> Any:
        """``transformers``' tokenizer of the folder."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self._folder, trust_remote_code=False)

    @cached_property
    def model(self) -> Any:
        """``transformers``' model of the folder (loads every weight)."""
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self._folder, trust_remote_code=False)
