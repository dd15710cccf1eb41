"""Finding, verifying and loading a checkpoint into a (possibly differently sharded) model.

Resolution (rank 0 decides, every rank follows): ``checkpoint.load`` with ``ckpt_step`` or its trackers
(``latest_train_state.pt``, then ``latest_checkpointed_iteration.txt``, then the newest committed ``iter_*`` folder);
else ``checkpoint.pretrained_checkpoint`` (a checkpoint root or ``iter_*`` folder, a weights file, or a Hugging Face
folder) as weights only. A folder is verified against its manifest (sizes and crc32) and, for DCP formats, its
``.metadata`` before any tensor is read; model shapes are compared with the model's and mismatches are named.

DCP folders load through ``torch.distributed.checkpoint.load`` into the backend's state dicts, which reshards to
any backend and world size (plain tensors, DTensor shards, by fully qualified parameter name). ``torch`` files
hold full tensors that are sliced locally into each rank's shards.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from megatron_bridge.checkpoint import files, mcore_megatron_fsdp, mcore_reader, saved_run
from megatron_bridge.checkpoint.converter import Converter, no_converter_error
from megatron_bridge.checkpoint.reader import (
    DCP_ERRORS,
    SafeFileSystemReader,
    SafeLoadPlanner,
    check_dcp_storage,
    dcp_error_message,
    dcp_tensor_shapes,
    latest_step,
    load_torch_file,
    pad_vocab,
    read_dcp_metadata,
    read_weights_file,
)
from megatron_bridge.config.checkpoint import CheckpointConfig
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import CheckpointError
from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)

_MAX_NAMED = 8
MCORE_FSDP_DTENSOR = "mcore_fsdp_dtensor"
MCORE_KINDS = ("mcore_dist", MCORE_FSDP_DTENSOR)
"""The source kinds of the megatron-core engine (torch_dist; fsdp_dtensor under Megatron FSDP)."""


@dataclass
class LoadSource:
    """What to load, as rank 0 resolved it."""

    path: str
    """An ``iter_*`` folder, a weights file or a HF folder."""
    kind: str
    """"dcp", "torch" (a checkpoint folder with model_optim.pt), "mcore_dist" (megatron-core torch_dist, the
    megatron-core engine's), "mcore_fsdp_dtensor" (the megatron-core engine's under Megatron FSDP), "weights" (a
    weights file) or "hf"."""
    step: int
    """Step of the checkpoint (0 for weights files and HF folders)."""
    weights_only: bool
    """Load model weights only (finetune / pretrained_checkpoint): no optimizer, scheduler, RNG or train state."""
    has_optimizer: bool = False
    """The checkpoint holds optimizer and scheduler state."""
    world_size: int | None = None
    """World size the checkpoint was written with."""


# ---------------------------------------------------------------------------------------------- resolution
def resolve_folder(root: str | Path, step: int | None) -> Path | None:
    """The committed folder to load from ``root`` (``step`` or the latest); None when ``root`` is empty."""
    root = Path(root)
    if step is None:
        if files.step_of(root) is not None:
            return root
        step = latest_step(root)
        if step is None:
            return None
        folder = files.iteration_dir(root, step)
        if not folder.is_dir():
            raise CheckpointError(
                f"the tracker of {str(root)!r} points at step {step} but {str(folder)!r} is missing (deleted, or a "
                "re-save of that step was interrupted between its renames: a '.trash-' folder there may hold it). Fix: "
                f"set checkpoint.ckpt_step to one of the committed steps {files.list_checkpoints(root)}, or restore "
                "the folder")
        return folder
    folder = files.iteration_dir(root, step)
    if not folder.is_dir():
        raise CheckpointError(
            f"checkpoint.ckpt_step={step}: {str(folder)!r} does not exist (available steps: "
            f"{files.list_checkpoints(root)})"
        )
    return folder


def resolve_checkpoint_folder(path: str | Path, step: int | None = None) -> Path:
    """The ``iter_NNNNNNN`` folder meant by ``path``: itself, or (for a checkpoint root) ``step`` or the latest."""
    path = Path(path)
    if files.step_of(path) is not None or (path / files.MANIFEST_FILENAME).is_file():
        return path
    if step is None:
        step = latest_step(path)  # the step training resumes from (train state tracker, text tracker, newest)
    if step is None:
        raise CheckpointError(f"{str(path)!r} holds no checkpoint (no tracker file and no iter_* folder)")
    folder = files.iteration_dir(path, step)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {str(folder)!r} does not exist")
    return folder


def inspect_folder(folder: Path, weights_only: bool) -> LoadSource:
    """Verify a committed folder (manifest sizes + crc32, DCP metadata) and describe it. A megatron-core
    ``torch_dist`` folder without our manifest (written by Megatron-LM or Megatron-Bridge) is checked through its
    ``metadata.json`` and DCP metadata (kind "mcore_dist")."""
    if not (folder / files.MANIFEST_FILENAME).is_file() and mcore_reader.is_mcore_checkpoint(folder):
        metadata = mcore_reader.check_mcore_folder(folder)
        from megatron_bridge.checkpoint.mcore_checkpoint import has_optimizer_state

        return LoadSource(str(folder), "mcore_dist", files.step_of(folder) or 0, weights_only,
                          has_optimizer_state(metadata))
    if not (folder / files.MANIFEST_FILENAME).is_file() and mcore_megatron_fsdp.is_fsdp_dtensor_folder(folder):
        check_dcp_storage(folder, read_dcp_metadata(folder))  # Megatron-Bridge's / Megatron-LM's fsdp_dtensor
        return LoadSource(str(folder), MCORE_FSDP_DTENSOR, files.step_of(folder) or 0, weights_only,
                          mcore_megatron_fsdp.has_optimizer_state(folder))
    manifest = files.verify_manifest(folder)
    fmt = manifest.get("format")
    engine = mcore_reader.manifest_engine(manifest)
    if fmt == "torch_dist" and engine == mcore_reader.MCORE_ENGINE:
        mcore_reader.check_mcore_folder(folder)
        kind = "mcore_dist"
    elif fmt == "fsdp_dtensor" and engine == mcore_reader.MCORE_ENGINE:
        check_dcp_storage(folder, read_dcp_metadata(folder))
        kind = MCORE_FSDP_DTENSOR
    elif fmt in ("torch_dist", "fsdp_dtensor"):
        check_dcp_storage(folder, read_dcp_metadata(folder))
        kind = "dcp"
    elif fmt == "torch":
        kind = "torch"
    else:
        raise CheckpointError(f"checkpoint {str(folder)!r} has an unknown format {fmt!r} in its manifest")
    return LoadSource(str(folder), kind, int(manifest.get("step", 0)), weights_only,
                      bool(manifest.get("has_optimizer")), manifest.get("world_size"))


def check_load_root(path_str: str, converter: Converter | None = None) -> None:
    """A ``checkpoint.load`` path that exists must be a checkpoint folder: a file, or a folder with other content
    and no checkpoint, is an error (not "starting fresh"). A missing or empty folder starts fresh."""
    path = Path(path_str)
    if not path.exists():
        return
    if not path.is_dir():
        raise CheckpointError(
            f"checkpoint.load={path_str!r} is a file, not a checkpoint folder: to start from a weights file use "
            "checkpoint.pretrained_checkpoint"
        )
    ignorable = {"run.lock"}
    other = sorted(p.name for p in path.iterdir() if p.name not in ignorable and not files.is_stale_folder(p))
    if other:
        hint = (" (a Hugging Face folder: use checkpoint.pretrained_checkpoint)"
                if converter is not None and converter.is_hf_folder(path) else "")
        raise CheckpointError(
            f"checkpoint.load={path_str!r} holds no checkpoint (no tracker file, no committed iter_* folder) but is "
            f"not empty: {other[:_MAX_NAMED]}{hint}. Point checkpoint.load at a checkpoint folder, or at a missing "
            "or empty folder to start fresh"
        )


def resolve_source(ckpt_cfg: CheckpointConfig, converter: Converter | None = None) -> LoadSource | None:
    """Decide what ``cfg.checkpoint`` asks to load (run on rank 0). None means start fresh. Hugging Face folders are
    recognised through ``converter`` (:mod:`.converter`)."""
    if ckpt_cfg.load:
        folder = resolve_folder(ckpt_cfg.load, ckpt_cfg.ckpt_step)
        if folder is not None:
            return inspect_folder(folder, weights_only=ckpt_cfg.finetune)
        check_load_root(ckpt_cfg.load, converter)
    if ckpt_cfg.pretrained_checkpoint:
        return resolve_pretrained(ckpt_cfg.pretrained_checkpoint, converter)
    if ckpt_cfg.load and ckpt_cfg.exit_on_missing_checkpoint:
        raise CheckpointError(
            f"checkpoint.load={ckpt_cfg.load!r} holds no checkpoint and checkpoint.exit_on_missing_checkpoint=True"
        )
    return None


def resolve_pretrained(path_str: str, converter: Converter | None = None) -> LoadSource:
    """Describe a ``pretrained_checkpoint`` path (always loaded as weights only); a Hugging Face folder is
    recognised through ``converter``."""
    path = Path(path_str)
    if path.is_file():
        return LoadSource(str(path), "weights", 0, True)
    if converter is not None and converter.is_hf_folder(path):
        return LoadSource(str(path), "hf", 0, True)
    folder = resolve_folder(path, None) if path.is_dir() else None
    if folder is None:
        raise CheckpointError(f"checkpoint.pretrained_checkpoint={path_str!r} holds no checkpoint")
    source = inspect_folder(folder, weights_only=True)
    source.step = 0
    return source


# ------------------------------------------------------------------------------------------------- shapes
def global_shapes(state: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Global shape of every tensor in a (flat) model state dict (DTensor shapes are global)."""
    return {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}


def check_shapes(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], where: str,
                 model_config: ModelConfig | None = None) -> None:
    """CheckpointError naming the keys whose presence or shape differs between the model and the checkpoint, and the
    fix (with ``model_config``: the model fields the checkpoint's run_config.yaml records otherwise)."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    different = sorted(k for k in set(expected) & set(found) if expected[k] != found[k])
    if not (missing or unexpected or different):
        return
    parts = []
    if different:
        shown = ", ".join(f"{k}: checkpoint {list(found[k])} vs model {list(expected[k])}"
                          for k in different[:_MAX_NAMED])
        parts.append(f"{len(different)} shape mismatch(es): {shown}")
    if missing:
        parts.append(f"{len(missing)} model key(s) missing from the checkpoint: {missing[:_MAX_NAMED]}")
    if unexpected:
        parts.append(f"{len(unexpected)} checkpoint key(s) not in the model: {unexpected[:_MAX_NAMED]}")
    raise CheckpointError(f"checkpoint {where} does not fit the model: " + "; ".join(parts)
                          + saved_run.model_mismatch_fix(where, model_config))


# --------------------------------------------------------------------------------------------------- loading
def model_shapes(state: dict[str, Any], group: dist.ProcessGroup | None) -> dict[str, dict[str, tuple[int, ...]]]:
    """Global shapes of the model entries of ``state``, over all ranks (collective): under pipeline parallelism each
    rank holds only its stages' keys, and together they must cover the checkpoint."""
    local = {k: global_shapes(v) for k, v in state.items() if k.startswith("model")}
    if not (dist.is_available() and dist.is_initialized()):
        return local
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, local, group=group)
    merged: dict[str, dict[str, tuple[int, ...]]] = {}
    for part in gathered:
        for chunk_key, shapes in part.items():
            merged.setdefault(chunk_key, {}).update(shapes)
    return merged


def load_dcp(source: LoadSource, state: dict[str, Any], group: dist.ProcessGroup | None,
             model_config: ModelConfig | None = None) -> None:
    """Fill ``state`` in place from a DCP folder (collective), after checking model keys and shapes (a mismatch
    names the fields of ``model_config`` the checkpoint was saved with otherwise)."""
    metadata = read_dcp_metadata(source.path)
    for chunk_key, shapes in model_shapes(state, group).items():
        check_shapes(shapes, dcp_tensor_shapes(metadata, chunk_key), source.path, model_config)
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(source.path), planner=SafeLoadPlanner(),
                 process_group=group)
    except CheckpointError:
        raise
    except DCP_ERRORS as exc:
        raise CheckpointError(f"loading {source.path!r} failed: {dcp_error_message(exc)}"
                              + saved_run.optimizer_layout_fix(source.path, state)) from exc


def full_state_of(source: LoadSource, padded_vocab_size: int | None, model_config: ModelConfig | None = None,
                  converter: Converter | None = None) -> dict[str, Any]:
    """Full-tensor state of a non-DCP source: ``{"model": ...}`` (+ optimizer and scheduler for torch folders).
    Weights files and HF folders get their vocabulary rows zero-padded to ``padded_vocab_size``. A HF folder (read by
    ``converter``) with ``model_config`` is first checked against it (the first differing field is named) and read
    lazily."""
    if source.kind == "hf" and converter is None:
        raise no_converter_error(source.path)
    if source.kind == "hf" and model_config is not None:
        return {"model": converter.hf_weights(source.path, model_config)}
    if source.kind == "torch":
        content = load_torch_file(Path(source.path) / files.TORCH_FILENAME, "checkpoint")
        if not isinstance(content, dict) or "model" not in content:
            raise CheckpointError(f"{source.path!r}/{files.TORCH_FILENAME} holds no 'model' state")
        return content
    weights = dict(converter.hf_weights(source.path, None)) if source.kind == "hf" else read_weights_file(source.path)
    return {"model": pad_vocab(weights, padded_vocab_size) if padded_vocab_size else weights}


def fill_from_full(target: Any, full: Any, path: str) -> Any:
    """Copy ``full`` (full tensors) into ``target`` (plain tensors or DTensor shards) following target's structure.

    Returns the filled structure; non-tensor leaves (hyper-parameters) are taken from ``full``.
    """
    if isinstance(target, dict):
        if not isinstance(full, Mapping):
            raise CheckpointError(f"checkpoint entry {path!r} is not a mapping")
        absent = [k for k in target if k not in full]
        if absent:
            raise CheckpointError(f"checkpoint lacks {len(absent)} entries under {path!r}: {absent[:_MAX_NAMED]}")
        return {k: fill_from_full(v, full[k], f"{path}.{k}") for k, v in target.items()}
    if isinstance(target, list):
        if not isinstance(full, list) or len(full) != len(target):
            raise CheckpointError(f"checkpoint entry {path!r} has a different length than the model's")
        return [fill_from_full(t, f, f"{path}.{i}") for i, (t, f) in enumerate(zip(target, full))]
    if isinstance(target, torch.Tensor):
        if not isinstance(full, torch.Tensor) or tuple(full.shape) != tuple(target.shape):
            got = list(full.shape) if isinstance(full, torch.Tensor) else type(full).__name__
            raise CheckpointError(f"checkpoint entry {path!r}: checkpoint {got} vs model {list(target.shape)}")
        copy_full_into(target, full)
        return target
    return full


def copy_full_into(target: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a full tensor into a plain tensor or into this rank's shard of a DTensor (no communication)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    with torch.no_grad():
        if isinstance(target, DTensor):
            local = distribute_tensor(full.to(target.dtype), target.device_mesh, target.placements,
                                      src_data_rank=None).to_local()
            target.to_local().copy_(local)
        else:
            target.copy_(full)


def load_full(source: LoadSource, state: dict[str, Any], padded_vocab_size: int | None,
              model_config: ModelConfig | None = None, group: dist.ProcessGroup | None = None,
              converter: Converter | None = None) -> None:
    """Fill ``state`` in place from a ``torch`` folder, a weights file or a HF folder (read by ``converter``;
    checked against ``model_config`` when given; collective: the model keys of all ranks are checked together)."""
    full = full_state_of(source, padded_vocab_size, model_config, converter)
    for chunk_key, shapes in model_shapes(state, group).items():
        if chunk_key not in full:
            raise CheckpointError(f"checkpoint {source.path!r} holds no {chunk_key!r} weights")
        weights = full[chunk_key]
        found = (weights.tensor_shapes() if hasattr(weights, "tensor_shapes")
                 else {k: tuple(v.shape) for k, v in weights.items() if isinstance(v, torch.Tensor)})
        check_shapes(shapes, found, source.path, model_config)
    for key in state:
        if key not in full:
            raise CheckpointError(f"checkpoint {source.path!r} holds no {key!r} state")
        state[key] = fill_from_full(state[key], full[key], key)


def read_train_state(folder: str | Path) -> dict[str, Any]:
    """``train_state.pt`` of a checkpoint folder (weights_only)."""
    state = load_torch_file(Path(folder) / files.TRAIN_STATE_FILENAME, "train state")
    if not isinstance(state, dict):
        raise CheckpointError(f"{str(folder)!r}/{files.TRAIN_STATE_FILENAME} is not a mapping")
    return state
