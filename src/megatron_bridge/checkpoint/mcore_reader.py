"""Reading megatron-core ``torch_dist`` checkpoints without executing anything they say.

megatron-core's own ``dist_checkpointing.load`` unpickles the DCP ``.metadata`` with ``pickle.load`` and its
``ShardedObject`` values (the common state, RNG states, optimizer hyper-parameters) with
``torch.load(weights_only=False)`` (torch's ``DefaultLoadPlanner.load_bytes``): a crafted checkpoint would run code.
:func:`load_sharded` does the same steps as megatron-core 0.19's ``dist_checkpointing.load`` (factories, common state,
validation, the PyTorch-DCP load, factory merges) with megatron-core's own helpers, but reads

* ``.metadata`` with the allow-listed unpickler of :mod:`megatron_bridge.checkpoint.reader`;
* every object with ``torch.load(weights_only=True)``; NumPy's RNG state (an ``ndarray`` in Megatron's
  ``np_rng_state``) is allowed through :func:`torch.serialization.safe_globals`, nothing else.

A legacy ``common.pt`` (megatron-core < 0.17) is read with ``weights_only=True`` too. Importing megatron-core widens
torch's ``weights_only`` allow-list process-wide (``megatron.core.safe_globals``: ``argparse.Namespace``, NumPy arrays,
``PosixPath``, its enums and ``OptimizerConfig``, ...), so Megatron-LM's ``args`` load; they are data classes, and
what they hold is still restricted (a function inside is refused).
"""

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import load as dcp_load

from megatron_bridge.checkpoint.reader import (
    DCP_ERRORS,
    SafeFileSystemReader,
    SafeLoadPlanner,
    check_dcp_storage,
    dcp_error_message,
    read_dcp_metadata,
)
from megatron_bridge.errors import CheckpointError


MCORE_CONFIG_FILENAME = "metadata.json"
"""megatron-core's marker of a distributed checkpoint folder (``{"sharded_backend": "torch_dist", ...}``)."""
COMMON_STATE_KEY = "common_state"
"""The ``ShardedObject`` key of the non-tensor ("common") part of the state dict (megatron-core ≥ 0.17)."""
LEGACY_COMMON_FILENAME = "common.pt"
MCORE_ENGINE = "megatron_core"
"""``manifest.json`` ``engine`` of the megatron-core engine's checkpoints (see mcore_checkpoint.py); folders written
before the key was renamed say it under ``layout``, which is read too (:func:`manifest_engine`)."""


def manifest_engine(manifest: dict[str, Any]) -> str | None:
    """The engine a manifest says wrote the folder (``engine``, or the older ``layout`` key); None: native."""
    return manifest.get("engine", manifest.get("layout"))


def _numpy_globals() -> list[Any]:
    """The NumPy names an ``ndarray`` of ``np.random.get_state()`` needs to unpickle, under NumPy 2's and NumPy 1's
    module paths (nothing else callable)."""
    from numpy._core.multiarray import _reconstruct

    return [_reconstruct, (_reconstruct, "numpy.core.multiarray._reconstruct"), np.ndarray, np.dtype,
            type(np.dtype(np.uint32))]


@contextmanager
def allow_numpy_rng() -> Iterator[None]:
    """``torch.load(weights_only=True)`` in this block also accepts NumPy arrays (Megatron's RNG state)."""
    with torch.serialization.safe_globals(_numpy_globals()):
        yield


def safe_torch_load(data: io.BytesIO | Path, what: str) -> Any:
    """``torch.load(weights_only=True)`` (NumPy RNG arrays allowed); CheckpointError naming ``what`` otherwise."""
    try:
        with allow_numpy_rng():
            return torch.load(data, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{what} holds objects that are not allowed or is corrupt: {exc}") from exc


def is_mcore_checkpoint(folder: str | Path) -> bool:
    """True for a folder that megatron-core's ``dist_checkpointing.save`` wrote (its ``metadata.json``)."""
    return (Path(folder) / MCORE_CONFIG_FILENAME).is_file()


def check_mcore_folder(folder: str | Path) -> Any:
    """Check a megatron-core ``torch_dist`` folder before reading tensors: ``metadata.json`` says ``torch_dist``,
    ``.metadata`` parses with the allow-listed unpickler, every shard file exists and is long enough.
    Returns the DCP metadata.

    Raises:
        CheckpointError: naming what is missing, truncated or of another backend.
    """
    folder = Path(folder)
    path = folder / MCORE_CONFIG_FILENAME
    if not path.is_file():
        raise CheckpointError(
            f"{str(folder)!r} is not a megatron-core distributed checkpoint (no {MCORE_CONFIG_FILENAME})")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{str(path)!r} is not valid JSON: {exc}") from exc
    backend = config.get("sharded_backend") if isinstance(config, dict) else None
    if backend != "torch_dist":
        raise CheckpointError(f"{str(folder)!r} is a megatron-core checkpoint of backend {backend!r}; only "
                              "'torch_dist' is supported")
    metadata = read_dcp_metadata(folder)
    check_dcp_storage(folder, metadata)
    return metadata


class SafeMegatronLoadPlanner(SafeLoadPlanner):
    """The safe planner of reader.py, also accepting Megatron's NumPy RNG arrays (and nothing more)."""

    def _load_value(self, value: io.BytesIO, fqn: str) -> Any:
        return safe_torch_load(value, f"checkpoint value {fqn!r}")


def _planner_class() -> type:
    from megatron.core.dist_checkpointing.strategies.torch import MCoreLoadPlanner

    class _SafeMCoreLoadPlanner(SafeMegatronLoadPlanner, MCoreLoadPlanner):
        """megatron-core's load planner (global shape validation), reading ``ShardedObject`` bytes through
        :class:`SafeMegatronLoadPlanner`."""

    return _SafeMCoreLoadPlanner


def load_common_state(folder: str | Path) -> dict[str, Any]:
    """The common (non-tensor) state of a megatron-core checkpoint, read safely in this process only."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    folder = Path(folder)
    legacy = folder / LEGACY_COMMON_FILENAME
    if legacy.is_file():
        common = safe_torch_load(legacy, f"{str(legacy)!r}")
    else:
        key = ShardedObject(COMMON_STATE_KEY, None, (1,), (0,)).unique_key
        state: dict[str, Any] = {key: io.BytesIO()}
        _dcp_read(state, folder, _planner_class()())
        loaded = state[key]
        common = loaded[0] if isinstance(loaded, list) and loaded else loaded
    if not isinstance(common, dict):
        raise CheckpointError(f"the common state of {str(folder)!r} is a {type(common).__name__}, not a mapping")
    return common


def _dcp_read(state: dict[str, Any], folder: Path, planner: Any) -> None:
    try:
        dcp_load(state, storage_reader=SafeFileSystemReader(folder), planner=planner, no_dist=True)
    except CheckpointError:
        raise
    except DCP_ERRORS as exc:
        raise CheckpointError(f"reading {str(folder)!r} failed: {dcp_error_message(exc)}") from exc


def check_keys(sharded_state_dict: dict[str, Any], metadata: Any, folder: str | Path) -> None:
    """CheckpointError naming the sharded tensors of the model/optimizer that the checkpoint lacks or holds with
    another global shape (megatron-core would raise a bare ``KeyError`` deep in the planner)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    stored = metadata.state_dict_metadata
    missing, different = set(), {}
    for item in nested_values(sharded_state_dict):
        if not isinstance(item, ShardedTensor) or item.allow_shape_mismatch:
            continue
        if item.key not in stored:
            missing.add(item.key)
        elif tuple(stored[item.key].size) != tuple(item.global_shape):
            different[item.key] = (tuple(stored[item.key].size), tuple(item.global_shape))
    if not (missing or different):
        return
    parts = []
    if different:
        shown = ", ".join(f"{k}: checkpoint {list(a)} vs model {list(b)}"
                          for k, (a, b) in sorted(different.items())[:8])
        parts.append(f"{len(different)} shape mismatch(es): {shown}")
    if missing:
        parts.append(f"{len(missing)} key(s) missing from the checkpoint: {sorted(missing)[:8]}")
    raise CheckpointError(f"checkpoint {str(folder)!r} does not fit the model: " + "; ".join(parts))


def load_sharded(sharded_state_dict: dict[str, Any], folder: str | Path,
                 common: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load ``sharded_state_dict`` (megatron-core ``ShardedTensor`` / ``ShardedObject`` / factories) from a
    megatron-core ``torch_dist`` folder, as ``dist_checkpointing.load`` does, through safe readers (module
    docstring). Every rank reads its own shards (no collective). Returns the loaded state dict, the common state
    merged in.

    Raises:
        CheckpointError: the folder is incomplete or corrupt, holds disallowed objects, or does not fit the model.
    """
    from megatron.core.dist_checkpointing.dict_utils import merge
    from megatron.core.dist_checkpointing.mapping import apply_factory_merges
    from megatron.core.dist_checkpointing.state_dict_utils import load_preprocess
    from megatron.core.dist_checkpointing.utils import extract_sharded_base

    folder = Path(folder)
    metadata = check_mcore_folder(folder)
    state, nonpersistent, factories = load_preprocess(sharded_state_dict)
    result = dict(common) if common is not None else load_common_state(folder)
    merge(result, nonpersistent)
    state, _ = extract_sharded_base(state)
    check_keys(state, metadata, folder)
    merge(result, _load_tensors_and_objects(state, folder))
    return apply_factory_merges(result, factories)


def _load_tensors_and_objects(state: dict[str, Any], folder: Path) -> dict[str, Any]:
    """megatron-core's ``TorchDistLoadShardedStrategy.load`` with the safe reader and planner."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from megatron.core.dist_checkpointing.strategies import torch as mcore_torch

    flexible = [t for t in nested_values(state) if isinstance(t, ShardedTensor) and not t.allow_shape_mismatch]
    mismatch_ok = {t.key: t for t in nested_values(state) if isinstance(t, ShardedTensor) and t.allow_shape_mismatch}
    original = state
    flat, flat_mapping, rename_mapping = mcore_torch._replace_state_dict_keys_with_sharded_keys(state)
    pyt_state = mcore_torch.mcore_to_pyt_state_dict(flat, True)
    planner = _planner_class()(shapes_validation_sharded_tensors=flexible,
                               allow_shape_mismatch_sharded_tensors=mismatch_ok,
                               flatten_state_dict=False, flatten_sharded_tensors=False)
    _dcp_read(pyt_state, folder, planner)
    loaded = {k: mcore_torch._unwrap_pyt_sharded_tensor(v) for k, v in pyt_state.items()}
    loaded = mcore_torch._replace_sharded_keys_with_state_dict_keys(loaded, flat_mapping, rename_mapping)
    mcore_torch._restore_dict_types(loaded, original)
    return loaded
