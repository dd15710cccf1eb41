"""Save and load of the megatron-core engine (``model.engine="megatron_core"``) in megatron-core's ``torch_dist``
distributed checkpoint format, as Megatron-LM and Megatron-Bridge write it (docs/training/checkpointing.md).

Saving is megatron-core's own ``dist_checkpointing.save`` (``TorchDistSaveShardedStrategy("torch_dist", 1)``,
wrapped in ``FullyParallelSaveStrategyWrapper`` over the data-parallel group with ``checkpoint.fully_parallel_save``)
of the state dict of :mod:`.mcore_state`, into the save's temporary folder; :class:`~.manager.CheckpointManager`
then commits it like every checkpoint (manifest, rename to ``iter_NNNNNNN``, trackers, ``most_recent_k``).
With ``checkpoint.async_save`` the tensors are written in the background as Megatron-Bridge does it:
``dist_checkpointing.save(..., async_sharded_save=True)`` plans the save (collective) and returns an
``AsyncRequest``, which :class:`AsyncMcoreSaves` runs in megatron-core's ``AsyncCallsQueue`` (a forked writer
process per save, megatron-core's built-in "mcore" async strategy: nvidia-resiliency-ext is not a dependency); the
commit is the request's last finalize step, so the trackers name the step only after every rank's shards,
``.metadata`` and ``metadata.json`` are written.
Loading goes through the safe reader of :mod:`.mcore_reader` (megatron-core's own loader unpickles without
restriction) and restores model, optimizer, scheduler and RNG as Megatron-Bridge's ``load_checkpoint`` does.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from megatron_bridge.checkpoint import mcore_reader, mcore_state, mcore_torch_fsdp2, saved_run
from megatron_bridge.checkpoint.reader import DCP_ERRORS, dcp_error_message
from megatron_bridge.errors import CheckpointError
from megatron_bridge.utils.logging import get_logger, log_rank_0


if TYPE_CHECKING:
    from megatron_bridge.checkpoint.train_state import TrainState
    from megatron_bridge.config.container import ConfigContainer

logger = get_logger(__name__)

_FULLY_RESHARDABLE = ("fully_reshardable", "fully_sharded_model_space")


@dataclass
class McoreParts:
    """What a megatron-core engine checkpoint saves and restores."""

    cfg: "ConfigContainer"
    chunks: list[torch.nn.Module]
    """The unwrapped ``GPTModel`` chunks."""
    optimizer: Any
    scheduler: Any
    train_state: "TrainState"
    wrapped: list[torch.nn.Module] | None = None
    """The wrapped chunks (Megatron FSDP's fsdp_dtensor checkpoints read megatron-fsdp's module inside them)."""


def parts_of(cfg: "ConfigContainer", backend: Any, optimizer: Any, scheduler: Any,
             train_state: "TrainState") -> McoreParts:
    """:class:`McoreParts` of a training run (the backend's chunks unwrapped, as Megatron-Bridge's
    ``unwrap_model``)."""
    return McoreParts(cfg, [backend.unwrap(c) for c in backend.chunks], optimizer, scheduler, train_state,
                      list(backend.chunks))


def _save_strategy(cfg: "ConfigContainer") -> Any:
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    strategy = TorchDistSaveShardedStrategy("torch_dist", 1)
    if cfg.checkpoint.fully_parallel_save:
        strategy = FullyParallelSaveStrategyWrapper(strategy, ps.get_data_parallel_group(with_context_parallel=True))
    return strategy


_WRITER_JOIN_TIMEOUT_S = 10.0
"""How long :meth:`AsyncMcoreSaves.abort` waits for a killed writer process to be reaped."""
ASYNC_STRATEGY = "mcore"
"""megatron-core's own async writer (Megatron-Bridge's ``async_strategy="mcore"``; its "nvrx" needs
nvidia-resiliency-ext)."""


def save(parts: McoreParts, folder: Path, *, async_save: bool = False) -> Any:
    """Write the checkpoint into ``folder`` with megatron-core's ``dist_checkpointing.save`` (collective: every
    rank; rank 0 writes ``.metadata`` and ``metadata.json``). With ``async_save``: plan it and return megatron-core's
    ``AsyncRequest`` (the state is staged when the request is scheduled; nothing is written before); else None."""
    from megatron.core import dist_checkpointing

    ckpt = parts.cfg.checkpoint
    if any(mcore_torch_fsdp2.is_fsdp2_chunk(chunk) for chunk in parts.chunks):
        mcore_torch_fsdp2.check_even_shards(parts.chunks)
    start_results_queue()
    metadata = mcore_state.content_metadata(parts.cfg)
    state = mcore_state.build_state_dict(
        parts.cfg, parts.chunks, parts.optimizer, parts.scheduler, parts.train_state,
        mcore_state.with_process_groups(metadata), is_loading=False, with_optim=ckpt.save_optim,
        with_rng=ckpt.save_rng)
    try:
        return dist_checkpointing.save(state, str(folder), _save_strategy(parts.cfg), content_metadata=metadata,
                                       async_sharded_save=async_save, async_strategy=ASYNC_STRATEGY)
    except CheckpointError:
        raise
    except DCP_ERRORS as exc:
        raise CheckpointError(f"megatron-core dist_checkpointing.save into {str(folder)!r} failed: "
                              f"{dcp_error_message(exc)}") from exc


class AsyncMcoreSaves:
    """megatron-core's ``AsyncCallsQueue`` for this engine's async saves, as Megatron-Bridge drives it: schedule a
    save's request, finalize finished ones each step (non-blocking), all of them before the next save and at exit
    (blocking). Finalizing is collective (every rank, same point); :meth:`abort` is not."""

    def __init__(self) -> None:
        from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

        self.queue = AsyncCallsQueue(persistent=False)

    def schedule(self, request: Any, commit: Any) -> None:
        """Start ``request`` (stage the state, fork the writer); ``commit`` runs on every rank after megatron-core's
        own finalize steps (``.metadata``, ``metadata.json``) once every rank's writer finished."""
        request.add_finalize_fn(commit)
        self.queue.schedule_async_request(request)

    def pending(self) -> int:
        """Saves scheduled and not yet finalized."""
        return self.queue.get_num_unfinalized_calls()

    def finalize(self, blocking: bool) -> list[int]:
        """Finalize the saves every rank has finished writing (``blocking``: wait for all). Returns their indices.

        Raises:
            CheckpointError: a writer or a finalize step failed (on every rank).
        """
        try:
            return self.queue.maybe_finalize_async_calls(blocking=blocking)
        except CheckpointError:
            raise
        except DCP_ERRORS as exc:
            raise CheckpointError(f"megatron-core async checkpoint save failed: {dcp_error_message(exc)}") from exc

    def abort(self) -> None:
        """Kill the writer processes and drop the pending saves without finalizing (no collective): their
        temporary folders are removed at the next start; the previous checkpoint stays the latest."""
        for call in list(self.queue.async_calls):
            process = getattr(call.async_caller, "process", None)
            call.async_caller.close(abort=True)  # kills the writer (SIGKILL), without reaping it
            if process is not None:
                process.join(timeout=_WRITER_JOIN_TIMEOUT_S)  # reaped: no zombie stays behind
        self.queue.async_calls.clear()


RESULTS_QUEUE_MP_MODE = "fork"
"""How the manager process behind megatron-core's write-results queue starts. megatron-core's ``torch_dist`` writer
spawns it at the first save by default; a spawned process re-imports the worker's main module and torch (3-5 CPU s
per rank, each time :func:`stop_writer_processes` has stopped the previous one). Megatron-LM forks it
(``init_persistent_async_worker``: ``get_write_results_queue(mp_mode="fork")``); so do we. The forked manager only
serves the queue: it touches neither CUDA nor the process groups."""


def start_results_queue() -> None:
    """Start megatron-core's write-results queue (its manager forked, :data:`RESULTS_QUEUE_MP_MODE`) unless one is
    running; its writer then uses that queue."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    filesystem_async.get_write_results_queue(mp_mode=RESULTS_QUEUE_MP_MODE)  # a no-op while one is running


def stop_writer_processes() -> None:
    """Stop the multiprocessing manager megatron-core's ``torch_dist`` writer starts at its first save (its results
    queue, ``filesystem_async._results_queue``), if one is running. A normal interpreter exit stops it through
    ``atexit``, but torchrun workers end with ``os._exit`` (:func:`megatron_bridge.utils.cli.finish`), which would
    leave it and its children orphaned. Megatron-LM stops it the same way (``megatron/training/async_utils.py``)."""
    import sys

    module = sys.modules.get("megatron.core.dist_checkpointing.strategies.filesystem_async")
    manager = getattr(getattr(module, "_results_queue", None), "_manager", None)
    if manager is None:
        return
    manager.shutdown()
    module._results_queue = None  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------------------------ load
def saved_parallel_sizes(folder: str | Path) -> tuple[int, int] | None:
    """(TP, PP) of the run that wrote ``folder``, from its ``run_config.yaml`` (ours and Megatron-Bridge's share the
    ``model`` field names); None when it has none or it does not parse with the safe YAML loader."""
    config = saved_run.read_run_config(folder)
    try:
        model = config["model"]  # type: ignore[index]
        return int(model["tensor_model_parallel_size"]), int(model.get("pipeline_model_parallel_size") or 1)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def has_optimizer_state(metadata: Any) -> bool:
    """True when the checkpoint's DCP metadata holds optimizer tensors."""
    return any(key.startswith("optimizer.") for key in metadata.state_dict_metadata)


def _check_optimizer_resharding(cfg: "ConfigContainer", folder: str | Path, sharding: str | None) -> None:
    """The distributed optimizer's ``dp_reshardable`` state loads at another DP size only: TP/PP must match."""
    if not cfg.optimizer.use_distributed_optimizer or sharding in _FULLY_RESHARDABLE:
        return
    saved = saved_parallel_sizes(folder)
    now = (cfg.model.tensor_model_parallel_size, cfg.model.pipeline_model_parallel_size)
    if saved is not None and saved != now:
        raise CheckpointError(
            f"checkpoint {str(folder)!r} was written at (TP, PP) = {saved} with the distributed optimizer's "
            f"{sharding!r} state, which loads only at the same TP and PP (this run: {now}): resume at {saved}, "
            "set checkpoint.load_optim=False (weights only), or save with "
            "checkpoint.dist_ckpt_optim_fully_reshardable=True")


def load(parts: McoreParts, folder: str | Path, *, load_optim: bool, load_rng: bool) -> bool:
    """Restore the model (and with ``load_optim`` the optimizer and schedule; with ``load_rng`` the RNG states when
    the checkpoint has this rank's) from a megatron-core ``torch_dist`` folder (every rank reads its own shards).
    Returns True when the RNG states were restored.

    Raises:
        CheckpointError: the folder is incomplete, corrupt, holds disallowed objects or does not fit the model.
    """
    metadata_dcp = mcore_reader.check_mcore_folder(folder)
    common = mcore_reader.load_common_state(folder)
    saved = common.get("content_metadata")
    metadata = dict(saved) if isinstance(saved, dict) else mcore_state.content_metadata(parts.cfg)
    if load_optim:
        saved_run.check_precision(parts.cfg, folder, metadata_dcp)
        _check_optimizer_resharding(parts.cfg, folder, metadata.get("distrib_optim_sharding_type"))
    with_rng = load_rng and mcore_state.rng_key_in(metadata_dcp)
    state = mcore_state.build_state_dict(
        parts.cfg, parts.chunks, parts.optimizer, parts.scheduler, parts.train_state,
        mcore_state.with_process_groups(metadata), is_loading=True, with_optim=load_optim, with_rng=with_rng)
    state.pop("opt_param_scheduler", None)  # a plain value: comes from the common state
    try:
        loaded = mcore_reader.load_sharded(state, folder, common)
    except CheckpointError as exc:  # missing keys / other shapes: name the model fields saved otherwise, if known
        if not saved_run.model_differences(folder, parts.cfg.model):
            raise
        raise CheckpointError(f"{exc}{saved_run.model_mismatch_fix(folder, parts.cfg.model)}") from exc
    for key, chunk in zip(mcore_state.model_keys(len(parts.chunks)), parts.chunks, strict=True):
        _load_model(chunk, loaded, key, folder, parts.cfg.model)
    if load_optim:
        _load_optimizer(parts, loaded, folder)
    elif hasattr(parts.optimizer, "reload_model_params"):
        parts.optimizer.reload_model_params()  # mixed precision: main params from the loaded weights
    if with_rng:
        mcore_state.set_rng_state(loaded[mcore_state.RNG_KEY])
    return with_rng


def _load_model(chunk: torch.nn.Module, loaded: dict[str, Any], key: str, folder: str | Path,
                model_cfg: Any = None) -> None:
    if key not in loaded:
        raise CheckpointError(f"checkpoint {str(folder)!r} holds no {key!r} state (model chunks differ)")
    state = loaded[key]
    if mcore_torch_fsdp2.is_fsdp2_chunk(chunk):  # local shards → DTensors of the live layout
        state = mcore_torch_fsdp2.as_live_dtensors(state, chunk.state_dict(keep_vars=True))
    try:
        chunk.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"checkpoint {str(folder)!r} does not fit the model: {exc}"
                              f"{saved_run.model_mismatch_fix(folder, model_cfg)}") from exc


def _load_optimizer(parts: McoreParts, loaded: dict[str, Any], folder: str | Path) -> None:
    if "optimizer" not in loaded or "opt_param_scheduler" not in loaded:
        raise CheckpointError(f"checkpoint {str(folder)!r} holds no optimizer or opt_param_scheduler state: set "
                              "checkpoint.load_optim=False")
    state = loaded["optimizer"]
    if any(mcore_torch_fsdp2.is_fsdp2_chunk(chunk) for chunk in parts.chunks):
        state = mcore_torch_fsdp2.as_live_dtensors(state, parts.optimizer.state_dict())
    with torch.no_grad():
        parts.optimizer.load_state_dict(state)
    mcore_state.untie_optimizer_steps(parts.optimizer)
    parts.scheduler.load_state_dict(mcore_state.scheduler_from_megatron(loaded["opt_param_scheduler"], parts.cfg))


def train_state_from_common(folder: str | Path) -> dict[str, Any]:
    """Train-state fields from the common state (checkpoints without ``train_state.pt``, e.g. Megatron-LM's)."""
    common = mcore_reader.load_common_state(folder)
    if "iteration" not in common:
        raise CheckpointError(f"checkpoint {str(folder)!r} has no train_state.pt and no 'iteration'")
    log_rank_0(logger, "%s has no train_state.pt: step from its 'iteration', sample counters start at 0", folder)
    return {"step": int(common["iteration"]),
            "floating_point_operations_so_far": float(common.get("num_floating_point_operations_so_far", 0))}
