"""Reading a Hugging Face model folder without executing anything and without loading it whole.

Weight files (the four ``save_pretrained`` writes): ``model.safetensors``; ``model.safetensors.index.json`` + shards;
``pytorch_model.bin``; ``pytorch_model.bin.index.json`` + shards. Safetensors tensors are read one at a time from
their shard; ``.bin`` files are read with ``torch.load(weights_only=True, mmap=True)``, one shard at a time. Every
tensor handed out is registered with :func:`megatron_bridge.bridge.memory.track`.
"""

import json
import os
from pathlib import Path
from typing import Any

import torch

from megatron_bridge.bridge.memory import track
from megatron_bridge.errors import BridgeError


CONFIG_FILENAME = "config.json"
SAFETENSORS_SINGLE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_SINGLE = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS_INDEX, SAFETENSORS_SINGLE, BIN_INDEX, BIN_SINGLE)
"""Weight files looked for, in this order of preference."""
ALLOW_NON_FINITE_ENV = "MEGATRON_BRIDGE_ALLOW_NON_FINITE_WEIGHTS"
"""Set to 1 to read weights holding NaN or Inf (refused by default: a corrupt or diverged checkpoint)."""


def weights_file(folder: str | Path) -> str | None:
    """The first of :data:`WEIGHT_FILES` present in ``folder``, else None."""
    folder = Path(folder)
    return next((name for name in WEIGHT_FILES if (folder / name).is_file()), None)


def is_hf_folder(path: str | Path) -> bool:
    """True for a folder with ``config.json`` and weights in one of the four weight files."""
    path = Path(path)
    return path.is_dir() and (path / CONFIG_FILENAME).is_file() and weights_file(path) is not None


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from ``path``; BridgeError naming ``what`` when missing or malformed."""
    try:
        content = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BridgeError(f"{what} {str(path)!r} is missing or not valid JSON: {exc}") from exc
    if not isinstance(content, dict):
        raise BridgeError(f"{what} {str(path)!r} is not a JSON object")
    return content


class HFWeightsReader:
    """Names, shapes and tensors of a HF folder's weights, at most one ``.bin`` shard loaded at a time."""

    def __init__(self, folder: str | Path, allow_non_finite: bool | None = None) -> None:
        self.folder = Path(folder)
        self.allow_non_finite = (os.environ.get(ALLOW_NON_FINITE_ENV, "") not in ("", "0")
                                 if allow_non_finite is None else allow_non_finite)
        weights_file_name = weights_file(self.folder)
        if weights_file_name is None:
            raise BridgeError(f"{str(self.folder)!r} has no weights: expected one of {', '.join(WEIGHT_FILES)}")
        self.weights_file = weights_file_name
        """The weights file or index read (one of :data:`WEIGHT_FILES`)."""
        self.is_safetensors = weights_file_name.startswith("model.safetensors")
        self.weight_map = self._weight_map()
        self._bin_file: str | None = None
        self._bin_tensors: dict[str, torch.Tensor] = {}

    def _weight_map(self) -> dict[str, str]:
        if self.weights_file in (SAFETENSORS_SINGLE, BIN_SINGLE):
            names = self._names_in(self.weights_file)
            return dict.fromkeys(names, self.weights_file)
        index = read_json(self.folder / self.weights_file, "weights index")
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise BridgeError(f"{str(self.folder / self.weights_file)!r} has no valid 'weight_map' {{name: file}}")
        for shard in sorted(set(weight_map.values())):
            if "/" in shard or shard.startswith(".") or not (self.folder / shard).is_file():
                raise BridgeError(f"shard {shard!r} listed in {str(self.folder / self.weights_file)!r} is missing")
        for shard in sorted(set(weight_map.values())):
            absent = set(k for k, v in weight_map.items() if v == shard) - set(self._names_in(shard))
            if absent:
                raise BridgeError(f"shard {str(self.folder / shard)!r} lacks {len(absent)} tensor(s) its index "
                                  f"lists, e.g. {sorted(absent)[:3]}")
        return dict(weight_map)

    # ------------------------------------------------------------------------------------------ file access
    def _open_safetensors(self, shard: str) -> Any:
        from safetensors import SafetensorError, safe_open

        try:
            return safe_open(str(self.folder / shard), framework="pt")
        except (OSError, SafetensorError) as exc:
            raise BridgeError(f"shard {str(self.folder / shard)!r} is unreadable (truncated or not safetensors): "
                              f"{exc}") from exc

    def _load_bin(self, shard: str) -> dict[str, torch.Tensor]:
        path = self.folder / shard
        try:
            content = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:
            raise BridgeError(f"shard {str(path)!r} is unreadable (truncated, or holds objects weights_only=True "
                              f"refuses): {exc}") from exc
        if not isinstance(content, dict) or not all(isinstance(v, torch.Tensor) for v in content.values()):
            raise BridgeError(f"shard {str(path)!r} holds no {{name: tensor}} mapping")
        return content

    def _names_in(self, shard: str) -> list[str]:
        if shard.endswith(".safetensors"):
            with self._open_safetensors(shard) as f:
                return list(f.keys())
        return list(self._load_bin(shard))

    # ------------------------------------------------------------------------------------------- public API
    def names(self) -> list[str]:
        """Every tensor name, in file order."""
        return list(self.weight_map)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of every tensor, read from the safetensors headers (``.bin``: from the mmapped shards)."""
        out: dict[str, tuple[int, ...]] = {}
        for shard in dict.fromkeys(self.weight_map.values()):
            if shard.endswith(".safetensors"):
                with self._open_safetensors(shard) as f:
                    for name in f.keys():
                        out[name] = tuple(f.get_slice(name).get_shape())
            else:
                out.update({k: tuple(v.shape) for k, v in self._load_bin(shard).items()})
        return {name: out[name] for name in self.weight_map}

    def get(self, name: str) -> torch.Tensor:
        """One tensor (a fresh CPU tensor for safetensors; from the cached shard for ``.bin``)."""
        shard = self.weight_map.get(name)
        if shard is None:
            raise BridgeError(f"{str(self.folder)!r} holds no tensor {name!r}")
        if shard.endswith(".safetensors"):
            from safetensors import SafetensorError

            with self._open_safetensors(shard) as f:
                try:
                    return self._finite(name, shard, track(f.get_tensor(name)))
                except (OSError, SafetensorError) as exc:
                    raise BridgeError(f"tensor {name!r} of {str(self.folder / shard)!r} is unreadable: {exc}") from exc
        if self._bin_file != shard:
            self._bin_tensors = {}  # drop the previous shard before loading the next
            self._bin_file = None
            self._bin_tensors = {k: track(v) for k, v in self._load_bin(shard).items()}
            self._bin_file = shard
        return self._finite(name, shard, self._bin_tensors[name])

    def _finite(self, name: str, shard: str, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor``, after checking it holds no NaN/Inf (unless allowed)."""
        if self.allow_non_finite or not tensor.is_floating_point():
            return tensor
        values = tensor.float() if tensor.element_size() == 1 else tensor  # fp8: torch has no isfinite for it
        bad = int((~torch.isfinite(values)).sum())
        if bad:
            raise BridgeError(f"tensor {name!r} of {str(self.folder / shard)!r} holds {bad} NaN/Inf value(s) of "
                              f"{tensor.numel()}: the checkpoint is corrupt or diverged; use another one, or set "
                              f"{ALLOW_NON_FINITE_ENV}=1 to load it anyway")
        return tensor

    def order(self, names: list[str]) -> list[str]:
        """``names`` sorted shard by shard (so ``.bin`` shards are each loaded once)."""
        rank = {shard: i for i, shard in enumerate(dict.fromkeys(self.weight_map.values()))}
        return sorted(names, key=lambda n: rank.get(self.weight_map.get(n, ""), len(rank)))

    def release(self) -> None:
        """Drop the cached ``.bin`` shard."""
        self._bin_tensors = {}
        self._bin_file = None
