"""Writing one checkpoint: the state dict, its three formats, the per-rank and rank-0 files, and the commit.

Formats (``cfg.checkpoint.ckpt_format``), all written with torch.distributed.checkpoint or ``torch.save``:

* ``torch_dist`` and ``fsdp_dtensor``: ``torch.distributed.checkpoint.save`` of the backend's DCP-ready state
  dicts. Each rank writes only its part (DTensor shards for FSDP2 / Megatron FSDP; replicated DDP tensors are
  de-duplicated across ranks by DCP's save planner), rank 0 writes the ``.metadata``.
* ``torch``: every rank gathers full tensors, rank 0 writes one ``model_optim.pt`` (small models, export).

A save is split into ``write`` (all ranks, into a temporary folder) and :func:`finalize_save` (rank 0, after all
ranks' files are durable): commit, trackers, ``most_recent_k`` cleanup.
"""

import io
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from megatron_bridge.checkpoint import files
from megatron_bridge.checkpoint.files import RUN_CONFIG_FILENAME, TORCH_FILENAME, TRAIN_STATE_FILENAME
from megatron_bridge.checkpoint.reader import DCP_ERRORS, dcp_error_message
from megatron_bridge.checkpoint.rng import save_rng_file
from megatron_bridge.errors import CheckpointError


DCP_FORMATS = ("torch_dist", "fsdp_dtensor")


@dataclass
class SaveJob:
    """Everything rank 0 needs to commit a checkpoint once its files are written."""

    root: Path
    """The ``checkpoint.save`` folder."""
    step: int
    """The step being saved."""
    tmp: Path
    """The temporary folder every rank writes into."""
    train_state_bytes: bytes
    """``train_state.pt`` content, captured when the save started (the loop moves on during async saves)."""
    config_yaml: str
    """``run_config.yaml`` content."""
    info: dict[str, Any] = field(default_factory=dict)
    """Extra manifest fields: format, backend, world size."""
    extra_files: dict[str, bytes] = field(default_factory=dict)
    """More rank-0 files by name (e.g. ``modelopt_state.pt``), captured when the save started."""

    @property
    def final(self) -> Path:
        """The committed folder ``iter_NNNNNNN``."""
        return files.iteration_dir(self.root, self.step)


def serialize(obj: Any) -> bytes:
    """``torch.save`` bytes of ``obj`` (plain numbers and tensors)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def collect_state(backend: Any, optimizer: torch.optim.Optimizer, scheduler: Any, save_optim: bool) -> dict[str, Any]:
    """The state dict to save: ``model`` (or ``model0``..), plus ``optimizer`` and ``scheduler`` when asked."""
    state = dict(backend.model_state_dict())
    if save_optim:
        state["optimizer"] = backend.optimizer_state_dict(optimizer)
        state["scheduler"] = scheduler.state_dict()
    return state


def to_full_tensors(tree: Any) -> Any:
    """Copy of ``tree`` with every DTensor gathered to a full CPU tensor (collective: call on all ranks)."""
    if isinstance(tree, dict):
        return {k: to_full_tensors(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [to_full_tensors(v) for v in tree]
    if isinstance(tree, torch.Tensor):
        if hasattr(tree, "full_tensor"):
            tree = tree.full_tensor()
        return tree.detach().to("cpu", copy=True)
    return tree


def write_rank_files(tmp: Path, rank: int, world_size: int, save_rng: bool) -> None:
    """Create the temporary folder and write this rank's own files (RNG states)."""
    tmp.mkdir(parents=True, exist_ok=True)
    if save_rng:
        save_rng_file(tmp, rank, world_size)


def write_rank0_files(job: SaveJob) -> None:
    """Write ``train_state.pt``, ``run_config.yaml`` and the extra files into the temporary folder (rank 0)."""
    (job.tmp / TRAIN_STATE_FILENAME).write_bytes(job.train_state_bytes)
    (job.tmp / RUN_CONFIG_FILENAME).write_text(job.config_yaml)
    for name, data in job.extra_files.items():
        (job.tmp / name).write_bytes(data)


def _writer(folder: Path) -> FileSystemWriter:
    return FileSystemWriter(folder, single_file_per_rank=True, sync_files=True, overwrite=False)


def write_dcp(state: dict[str, Any], folder: Path, group: dist.ProcessGroup | None) -> None:
    """Synchronous DCP save of ``state`` into ``folder`` (collective)."""
    try:
        dcp.save(state, storage_writer=_writer(folder), planner=DefaultSavePlanner(), process_group=group)
    except DCP_ERRORS as exc:
        raise CheckpointError(f"writing checkpoint shards to {str(folder)!r} failed: {dcp_error_message(exc)}") from exc


def start_async_dcp(state: dict[str, Any], folder: Path, group: dist.ProcessGroup | None) -> Future:
    """Start a DCP async save: stages ``state`` to CPU now, writes in a background thread. Returns its future."""
    result = dcp.async_save(state, storage_writer=_writer(folder), planner=DefaultSavePlanner(), process_group=group)
    return getattr(result, "upload_completion", result)


def write_torch_file(state: dict[str, Any], folder: Path, rank: int) -> None:
    """Gather full tensors on every rank; rank 0 writes ``model_optim.pt``."""
    full = to_full_tensors(state)
    if rank == 0:
        torch.save(full, folder / TORCH_FILENAME)


def finalize_save(job: SaveJob, most_recent_k: int) -> None:
    """Rank 0, after every rank's files are written: commit the folder, update the trackers, clean up.

    Order: fsync + manifest + rename (``files.commit``), then ``latest_train_state.pt`` and
    ``latest_checkpointed_iteration.txt``, then ``most_recent_k`` and removal of interrupted saves' folders.
    """
    write_rank0_files(job)
    files.commit(job.tmp, job.final, {"step": job.step, **job.info})
    files.write_trackers(job.root, job.step, job.train_state_bytes)
    files.keep_most_recent(job.root, most_recent_k, protect=job.step)
    files.remove_stale_folders(job.root)
