"""The reader of the native engine's formats (DCP folders, ``torch`` files, weights files), which executes nothing
the files say.

* DCP's ``.metadata`` is a pickle: :class:`SafeFileSystemReader` unpickles it with an allow-list of the DCP metadata
  classes (anything else is a :class:`CheckpointError`).
* DCP stores non-tensor values (optimizer hyper-parameters, scheduler state) as ``torch.save`` bytes and its default
  planner reads them with ``weights_only=False``: :class:`SafeLoadPlanner` reads them with ``weights_only=True``.
* Plain files go through :func:`load_torch_file` (``torch.load(weights_only=True)``).

Whole-model reads in one process (no process group): :func:`read_dcp_model_weights` (a DCP folder's full model
tensors) and :func:`read_weights_file` (``{"model": {name: tensor}}`` or ``{name: tensor}``); :func:`pad_vocab` pads
their vocabulary rows for a model. megatron-core's format has its own reader (``mcore_reader.py``).
"""

import io
import pathlib
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import ReadItem

from megatron_bridge.checkpoint import files
from megatron_bridge.checkpoint.files import DCP_METADATA_FILENAME
from megatron_bridge.config.decoder_names import VOCAB_PARAMETERS
from megatron_bridge.errors import CheckpointError
from megatron_bridge.utils.logging import get_logger
from megatron_bridge.utils.paths import file_problem


logger = get_logger(__name__)


_ALLOWED_MODULES = {"torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.planner"}
"""Modules whose own classes (plain dataclasses and enums) may appear in ``.metadata``; megatron-core's writer also
stores the ranks' save plans (``SavePlan``, ``WriteItem``) there."""
_ALLOWED_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickler that only resolves the classes a DCP ``.metadata`` file legitimately refers to."""

    def find_class(self, module: str, name: str) -> Any:
        if "." not in name:
            if (module, name) in _ALLOWED_GLOBALS:
                return super().find_class(module, name)
            if module in _ALLOWED_MODULES:  # only the classes defined there, not names they import
                obj = super().find_class(module, name)
                if isinstance(obj, type) and obj.__module__ == module:
                    return obj
            if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype | torch.memory_format):
                return getattr(torch, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in DCP metadata")


def read_dcp_metadata(folder: str | Path) -> Metadata:
    """Parse a DCP ``.metadata`` file with the allow-listed unpickler.

    Raises:
        CheckpointError: the file is missing, truncated, or refers to anything but DCP metadata classes.
    """
    path = Path(folder) / DCP_METADATA_FILENAME
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(folder)!r} has no DCP {DCP_METADATA_FILENAME} file (incomplete save)")
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except Exception as exc:
        raise CheckpointError(f"DCP metadata {str(path)!r} is unreadable or not allowed: {exc}") from exc
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"DCP metadata {str(path)!r} holds a {type(metadata).__name__}, not Metadata")
    return metadata


def check_dcp_storage(folder: str | Path, metadata: Metadata) -> None:
    """Check that every shard file the metadata refers to exists and is long enough (truncation check)."""
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        rel = getattr(info, "relative_path", None)
        if rel is None:
            continue
        needed[rel] = max(needed.get(rel, 0), int(info.offset) + int(info.length))
    for rel, end in sorted(needed.items()):
        path = Path(folder) / rel
        if not path.is_file():
            raise CheckpointError(f"checkpoint {str(folder)!r} is missing shard file {rel!r}")
        size = path.stat().st_size
        if size < end:
            raise CheckpointError(
                f"shard file {str(path)!r} is {size} bytes but the DCP metadata needs {end} (truncated)"
            )


class SafeFileSystemReader(FileSystemReader):
    """DCP's file-system reader with the allow-listed metadata unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Read ``.metadata`` without executing arbitrary pickled code."""
        if kwargs.get("rank") is not None:
            raise CheckpointError("per-rank DCP metadata (use_collectives=False checkpoints) is not supported")
        metadata = read_dcp_metadata(pathlib.Path(self.path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading non-tensor values with ``torch.load(weights_only=True)``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Restore one non-tensor value (e.g. a learning rate) safely."""
        fqn = read_item.dest_index.fqn
        obj = self._load_value(value, fqn)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj

    def _load_value(self, value: io.BytesIO, fqn: str) -> Any:
        """``torch.load(weights_only=True)`` of the value stored under ``fqn``; subclasses widen what is allowed."""
        try:
            return torch.load(value, weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"value {fqn!r} in the checkpoint is not loadable: {exc}") from exc


def load_torch_file(path: str | Path, what: str) -> Any:
    """``torch.load(path, weights_only=True, map_location="cpu")``; CheckpointError naming ``what`` on failure."""
    path = Path(path)
    problem = file_problem(path)
    if problem:
        raise CheckpointError(f"{what} file {str(path)!r} {problem}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{what} file {str(path)!r} is corrupt or holds disallowed objects: {exc}") from exc


def dcp_tensor_shapes(metadata: Metadata, prefix: str) -> dict[str, tuple[int, ...]]:
    """Global shapes of the tensors under ``prefix.`` in DCP metadata, keyed without the prefix."""
    out = {}
    for key, item in metadata.state_dict_metadata.items():
        if key.startswith(prefix + ".") and isinstance(item, TensorStorageMetadata):
            out[key[len(prefix) + 1 :]] = tuple(item.size)
    return out


DCP_ERRORS = (Exception, CheckpointException)
"""What a DCP call can raise (its CheckpointException is a BaseException, so ``except Exception`` misses it)."""


def dcp_error_message(exc: BaseException) -> str:
    """A one-line-per-rank summary of a DCP failure (the ranks' exceptions, without their tracebacks)."""
    if isinstance(exc, CheckpointException):
        return "; ".join(f"rank {r}: {type(e).__name__}: {e}" for r, (e, _) in sorted(exc.failures.items()))
    return f"{type(exc).__name__}: {exc}"


def latest_step(root: str | Path) -> int | None:
    """The newest committed step of a checkpoint root per its trackers (None when it has no checkpoint): the step
    training resumes from and ``convert.py`` exports (``latest_train_state.pt``, then
    ``latest_checkpointed_iteration.txt``, then the newest ``iter_*`` folder).

    Raises:
        CheckpointError: a tracker that holds no step number (corrupt), naming the file and the committed steps.
    """
    root = Path(root)
    state_path = root / files.LATEST_TRAIN_STATE_FILENAME
    if state_path.is_file():
        state = load_torch_file(state_path, "tracker")
        step = state.get("step") if isinstance(state, dict) else None
        if isinstance(step, torch.Tensor) and step.numel() == 1 and not step.is_floating_point():
            step = int(step.item())  # Megatron-Bridge's TrainState.state_dict() (0-d tensors)
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise CheckpointError(
                f"tracker {str(state_path)!r} holds no integer 'step' (found {type(step).__name__}). Fix: set "
                f"checkpoint.ckpt_step to one of the committed steps {files.list_checkpoints(root)}, or delete the "
                f"file to resume from {files.TRACKER_FILENAME}")
        if (root / files.TRACKER_FILENAME).is_file() and files.read_tracker_step(root) != step:
            logger.warning("%s: %s says step %s but %s says step %d; training and convert.py both use step %d",
                           root, files.TRACKER_FILENAME, files.read_tracker_step(root),
                           files.LATEST_TRAIN_STATE_FILENAME, step, step)
        return step
    step = files.read_tracker_step(root)
    if step is not None:
        return step
    steps = files.list_checkpoints(root)
    if steps:
        logger.warning("%s has no tracker file; using its newest committed checkpoint (step %d)", root, steps[-1])
        return steps[-1]
    return None


# -------------------------------------------------------------------------------------------- whole models
VOCAB_KEYS = VOCAB_PARAMETERS
"""Our parameters whose rows are the (padded) vocabulary."""


def read_weights_file(path: str | Path) -> dict[str, torch.Tensor]:
    """The ``{name: tensor}`` weights of a file written by ``write_torch_weights`` (or a ``model_optim.pt``)."""
    content = load_torch_file(path, "weights")
    weights = content.get("model", content) if isinstance(content, dict) else None
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise CheckpointError(f"{str(path)!r} holds no {{name: tensor}} model weights")
    return weights


def read_dcp_tensors(folder: str | Path, select: Callable[[dict[str, Any]], dict[str, TensorStorageMetadata]],
                     what: str = "DCP checkpoint") -> dict[str, torch.Tensor]:
    """The full tensors that ``select`` picks from a DCP checkpoint's metadata (key → its storage metadata; it may
    raise :class:`CheckpointError` for what it refuses), read in this process only (no process group), keyed as
    stored. ``what`` names the folder's kind in errors."""
    metadata = read_dcp_metadata(folder)
    check_dcp_storage(folder, metadata)
    chosen = select(metadata.state_dict_metadata)
    state = {key: torch.empty(tuple(item.size), dtype=item.properties.dtype) for key, item in chosen.items()}
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(folder), planner=SafeLoadPlanner(), no_dist=True)
    except CheckpointError:
        raise
    except DCP_ERRORS as exc:
        raise CheckpointError(f"reading {what} {str(folder)!r} failed: {dcp_error_message(exc)}") from exc
    return state


def read_dcp_model_weights(folder: str | Path, prefix: str = "model") -> dict[str, torch.Tensor]:
    """The full tensors under ``prefix`` of a DCP checkpoint, read in this process only (no process group)."""

    def under_prefix(stored: dict[str, Any]) -> dict[str, TensorStorageMetadata]:
        chosen = {k: v for k, v in stored.items()
                  if k.startswith(prefix + ".") and isinstance(v, TensorStorageMetadata)}
        if not chosen:
            raise CheckpointError(f"DCP checkpoint {str(folder)!r} holds no '{prefix}' tensors")
        return chosen

    return {key[len(prefix) + 1 :]: tensor for key, tensor in read_dcp_tensors(folder, under_prefix).items()}


def read_native_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """Full model weights of a committed native-engine ``iter_*`` folder (DCP or ``torch``), manifest verified."""
    folder = Path(folder)
    manifest = files.verify_manifest(folder)
    if manifest.get("format") == "torch" or (folder / files.TORCH_FILENAME).is_file():
        return read_weights_file(folder / files.TORCH_FILENAME)
    return read_dcp_model_weights(folder)


def pad_vocab(weights: dict[str, torch.Tensor], padded_vocab_size: int) -> dict[str, torch.Tensor]:
    """``weights`` with the vocabulary rows of the embedding and output layer zero-padded to
    ``padded_vocab_size``."""
    return {k: pad_rows(v, padded_vocab_size) if k in VOCAB_KEYS and v.shape[0] < padded_vocab_size else v
            for k, v in weights.items()}


def pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``tensor`` with zero rows appended up to ``rows``."""
    pad = tensor.new_zeros((rows - tensor.shape[0], *tensor.shape[1:]))
    return torch.cat([tensor, pad], dim=0)
