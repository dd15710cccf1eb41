"""What the loader asks of the conversion floor: the sources this package has no reader for, and copies of one
engine's checkpoint in the other engine's format.

``checkpoint/`` reads the engines' own formats. A Hugging Face folder given as ``checkpoint.pretrained_checkpoint``,
or a checkpoint of the other engine, is read or converted by the conversion code of :mod:`megatron_bridge.bridge`
(a floor above; docs/architecture.md), which imports ``checkpoint/`` and never the other way round. So the loader
takes a :class:`Converter` as an argument: ``pretrain()`` hands
:class:`megatron_bridge.bridge.converter.PretrainedConverter` to the
:class:`~megatron_bridge.checkpoint.manager.CheckpointManager` (``foreign.py`` uses it for the other engine's
checkpoints). Without one, such a source is refused with an error that names the fix.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from megatron_bridge.errors import CheckpointError


if TYPE_CHECKING:
    from megatron_bridge.config.model import ModelConfig


class Converter(Protocol):
    """Reads, under our parameter names, what ``checkpoint/`` cannot (Hugging Face folders), and writes one engine's
    checkpoint in the other's format."""

    def is_hf_folder(self, path: Path) -> bool:
        """True for a Hugging Face model folder (``config.json`` and weights)."""
        ...

    def hf_weights(self, path: str | Path, model_config: "ModelConfig | None") -> Mapping[str, torch.Tensor]:
        """The folder's weights under our names: checked against ``model_config`` and padded for it (read lazily)
        when given, else as stored (the folder's vocabulary rows)."""
        ...

    def convert_for_engine(self, path: str, kind: str, model: "ModelConfig", engine: str,
                           out_dir: Path) -> tuple[str, str]:
        """Write the model weights of the source at ``path`` (the loader's ``kind``) exactly, in ``engine``'s format
        for ``model``, under ``out_dir``; returns ``(path, kind)`` of the copy for the loader."""
        ...


def no_converter_error(path: str | Path) -> CheckpointError:
    """The error for a Hugging Face source met without a converter."""
    return CheckpointError(
        f"{str(path)!r} is a Hugging Face folder, which the checkpoint loader reads only through the Bridge: "
        "pretrain() passes it; a CheckpointManager built by hand needs "
        "converter=megatron_bridge.bridge.converter.PretrainedConverter()")
