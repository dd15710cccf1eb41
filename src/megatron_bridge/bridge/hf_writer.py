"""Writing Hugging Face weights: safetensors shards of at most ``max_shard_size`` bytes, plus the index, streamed.

The writer is given every tensor's name, shape and dtype up front (:class:`TensorSpec`), so it lays out the shards
before any tensor exists: a shard is written as a safetensors header (8-byte little-endian length, then the JSON
``{"__metadata__": ..., name: {"dtype", "shape", "data_offsets"}}`` padded with spaces to a multiple of 8) followed
by the raw tensor bytes at the offsets the header states. Each tensor, as it is produced, is cast and written at its
offset (in any order), and nothing is kept: memory does not grow with the shard size. The layout is the one
``safetensors.torch.save_file`` writes (tensors sorted by dtype size, then name), so the files are byte for byte
what it would write.

One shard is named ``model.safetensors`` (no index); several are ``model-0000K-of-0000N.safetensors`` with
``model.safetensors.index.json``, as ``save_pretrained`` writes them.
"""

import json
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from megatron_bridge.bridge.hf_reader import SAFETENSORS_INDEX, SAFETENSORS_SINGLE
from megatron_bridge.bridge.memory import track
from megatron_bridge.errors import BridgeError


DEFAULT_MAX_SHARD_SIZE = 5 * 1024**3
"""5 GB, as ``save_pretrained``."""
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
    torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}
"""torch dtype → the safetensors header's dtype name."""


def parse_size(size: int | str) -> int:
    """Bytes of ``size``: an int, or a string like ``"500MB"``, ``"2GiB"``, ``"1000"``."""
    if isinstance(size, int) and size > 0:
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(size))
    if match is None or match.group(2).upper() not in _UNITS or float(match.group(1)) <= 0:
        raise BridgeError(f"max_shard_size={size!r} is not a size; use bytes or e.g. '500MB', '5GB', '2GiB'")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


@dataclass(frozen=True)
class TensorSpec:
    """One tensor the writer will be given: its HF name, shape and the dtype it is written in."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's data."""
        numel = 1
        for dim in self.shape:
            numel *= dim
        return numel * self.dtype.itemsize


class _Shard:
    """One safetensors file: its header and every tensor's byte offset, fixed before any tensor is written."""

    def __init__(self, path: Path, specs: list[TensorSpec]) -> None:
        self.path, self.specs = path, {s.name: s for s in specs}
        order = sorted(specs, key=lambda s: (-s.dtype.itemsize, s.name))  # save_file's order
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        self.offsets: dict[str, int] = {}
        offset = 0
        for spec in order:
            header[spec.name] = {"dtype": SAFETENSORS_DTYPES[spec.dtype], "shape": list(spec.shape),
                                 "data_offsets": [offset, offset + spec.nbytes]}
            self.offsets[spec.name] = offset
            offset += spec.nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        self.header = struct.pack("<Q", len(text)) + text
        self.size = len(self.header) + offset
        self.data_bytes = offset
        self.pending = set(self.specs)
        self._fd: int | None = None

    def write(self, name: str, data: memoryview) -> None:
        """Write one tensor's bytes at its offset; the file is closed when its last tensor is in."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            _pwrite_all(self._fd, memoryview(self.header), 0)
            os.ftruncate(self._fd, self.size)
        _pwrite_all(self._fd, data, len(self.header) + self.offsets[name])
        self.pending.discard(name)
        if not self.pending:
            self.close()

    def close(self) -> None:
        """Close the file (if open)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def plan_shards(specs: Sequence[TensorSpec], max_bytes: int) -> list[list[TensorSpec]]:
    """``specs`` in order, cut into shards of at most ``max_bytes`` (a bigger tensor gets its own shard)."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + spec.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.nbytes
    return shards


class SafetensorsShardWriter:
    """Writes the tensors of ``specs`` into shards of at most ``max_shard_size`` bytes, each tensor as it is
    added (module docstring); :meth:`finish` checks every tensor came and writes the index."""

    def __init__(self, folder: str | Path, specs: Sequence[TensorSpec],
                 max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE) -> None:
        self.folder = Path(folder)
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            repeated = sorted({n for n in names if names.count(n) > 1})
            raise BridgeError(f"tensor names repeat in the export plan: {repeated[:6]}")
        groups = plan_shards(specs, parse_size(max_shard_size))
        count = len(groups)
        self._shards = [_Shard(self.folder / (SAFETENSORS_SINGLE if count == 1 else
                                              f"model-{i:05d}-of-{count:05d}.safetensors"), group)
                        for i, group in enumerate(groups, start=1)]
        self._where = {name: shard for shard in self._shards for name in shard.specs}
        self.total_bytes = sum(shard.data_bytes for shard in self._shards)

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Cast ``tensor`` to its planned dtype and write it; BridgeError for a tensor not planned, given twice or
        of another shape."""
        shard = self._where.get(name)
        if shard is None:
            raise BridgeError(f"tensor {name!r} is not one the export planned (the model and the mapping disagree)")
        if name not in shard.pending:
            raise BridgeError(f"tensor {name!r} was exported twice")
        spec = shard.specs[name]
        if tuple(tensor.shape) != spec.shape:
            raise BridgeError(f"tensor {name!r} has shape {list(tensor.shape)} but the export planned "
                              f"{list(spec.shape)}")
        tensor = tensor.detach().to("cpu")
        if tensor.dtype != spec.dtype:
            if not tensor.is_floating_point():
                raise BridgeError(f"tensor {name!r} is {tensor.dtype}, not {spec.dtype}")
            tensor = track(tensor.to(spec.dtype))
        if not tensor.is_contiguous():
            tensor = track(tensor.contiguous())
        if tensor.numel():
            shard.write(name, memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
        else:
            shard.write(name, memoryview(b""))

    def finish(self) -> list[str]:
        """Check every planned tensor was written, write the index (several shards); returns the file names."""
        missing = sorted(n for shard in self._shards for n in shard.pending)
        if missing:
            self.close()
            raise BridgeError(f"the export never produced {len(missing)} tensor(s): {missing[:6]}")
        files = [shard.path.name for shard in self._shards]
        if len(files) == 1:
            return files
        weight_map = {name: shard.path.name for shard in self._shards for name in shard.specs}
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
        (self.folder / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
        return [*files, SAFETENSORS_INDEX]

    def close(self) -> None:
        """Close any open shard file (after an error; the staged folder is then removed)."""
        for shard in self._shards:
            shard.close()
