"""Writing Hugging Face weights: safetensors shards of at most ``max_shard_size`` bytes, plus the index.

Tensors are added one at a time; a shard is written as soon as the next tensor would overflow it, so at most one
shard (plus the tensor being added) is held. One shard is named ``model.safetensors`` (no index); several are
``model-0000K-of-0000N.safetensors`` with ``model.safetensors.index.json``, as ``save_pretrained`` writes them.
"""

import json
import os
import re
from pathlib import Path

import torch

from megatron_bridge.bridge.hf_reader import SAFETENSORS_INDEX, SAFETENSORS_SINGLE
from megatron_bridge.bridge.memory import track
from megatron_bridge.errors import BridgeError


DEFAULT_MAX_SHARD_SIZE = 5 * 1024**3
"""5 GB, as ``save_pretrained``."""
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(size: int | str) -> int:
    """Bytes of ``size``: an int, or a string like ``"500MB"``, ``"2GiB"``, ``"1000"``."""
    if isinstance(size, int) and size > 0:
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(size))
    if match is None or match.group(2).upper() not in _UNITS or float(match.group(1)) <= 0:
        raise BridgeError(f"max_shard_size={size!r} is not a size; use bytes or e.g. '500MB', '5GB', '2GiB'")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


class SafetensorsShardWriter:
    """Accumulates tensors into shards of at most ``max_shard_size`` bytes (a bigger tensor gets its own shard)."""

    def __init__(self, folder: str | Path, max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
                 dtype: torch.dtype | None = None) -> None:
        self.folder = Path(folder)
        self.max_bytes = parse_size(max_shard_size)
        self.dtype = dtype
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_bytes = 0
        self._shards: list[tuple[str, list[str]]] = []
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Queue one tensor (cast to ``dtype`` when given); writes the current shard first if it would overflow."""
        if name in self._pending or any(name in names for _, names in self._shards):
            raise BridgeError(f"tensor {name!r} was exported twice")
        tensor = tensor.detach().to("cpu")
        if self.dtype is not None and tensor.is_floating_point() and tensor.dtype != self.dtype:
            tensor = track(tensor.to(self.dtype))
        if not tensor.is_contiguous() or tensor.untyped_storage().nbytes() != tensor.nbytes:
            tensor = track(tensor.contiguous().clone())
        if self._pending and self._pending_bytes + tensor.nbytes > self.max_bytes:
            self._flush()
        self._pending[name] = tensor
        self._pending_bytes += tensor.nbytes

    def _flush(self) -> None:
        from safetensors.torch import save_file

        name = f".shard-{len(self._shards):05d}.safetensors"
        save_file(self._pending, str(self.folder / name), metadata={"format": "pt"})
        self._shards.append((name, list(self._pending)))
        self.total_bytes += self._pending_bytes
        self._pending, self._pending_bytes = {}, 0

    def finish(self) -> list[str]:
        """Write the last shard, give the shards their final names and write the index; returns the file names."""
        if self._pending or not self._shards:
            self._flush()
        if len(self._shards) == 1:
            os.rename(self.folder / self._shards[0][0], self.folder / SAFETENSORS_SINGLE)
            return [SAFETENSORS_SINGLE]
        total = len(self._shards)
        weight_map: dict[str, str] = {}
        files = []
        for i, (tmp_name, names) in enumerate(self._shards, start=1):
            final = f"model-{i:05d}-of-{total:05d}.safetensors"
            os.rename(self.folder / tmp_name, self.folder / final)
            weight_map.update(dict.fromkeys(names, final))
            files.append(final)
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
        (self.folder / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
        return [*files, SAFETENSORS_INDEX]
