"""``CheckpointManager``: the one object the training loop talks to for saving and resuming.

The loop calls :meth:`~CheckpointManager.load` once at setup, :meth:`~CheckpointManager.should_save` /
:meth:`~CheckpointManager.save` after steps, :meth:`~CheckpointManager.poll` every step (finalizes finished async
saves) and :meth:`~CheckpointManager.close` at exit (waits for pending saves). Every rank calls every method.
"""

import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from megatron_bridge.checkpoint import (
    comm,
    files,
    foreign,
    mcore_checkpoint,
    mcore_megatron_fsdp,
    mcore_reader,
    mcore_state,
    run_folder,
)
from megatron_bridge.checkpoint import load as loading
from megatron_bridge.checkpoint import save as saving
from megatron_bridge.checkpoint.reader import DCP_ERRORS, dcp_error_message
from megatron_bridge.checkpoint.rng import load_rng_file
from megatron_bridge.errors import CheckpointError, CheckpointOverwriteError, DiskFullError
from megatron_bridge.utils.logging import get_logger, log_rank_0, warn_once


if TYPE_CHECKING:
    from torch.distributed.checkpoint.stateful import Stateful

    from megatron_bridge.checkpoint.converter import Converter
    from megatron_bridge.checkpoint.train_state import TrainState
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.distributed.base import DataParallelBackend
    from megatron_bridge.engines.base import Engine

logger = get_logger(__name__)


@dataclass
class _PendingSave:
    step: int
    future: Future
    started: float


class CheckpointManager:
    """Saves and loads checkpoints as ``cfg.checkpoint`` says (see docs/training/checkpointing.md).

    Args:
        cfg: the run config; ``cfg.checkpoint`` drives everything, the whole config is saved as run_config.yaml.
        backend: the data-parallel backend (provides DCP-ready model and optimizer state dicts).
        optimizer: the optimizer (as returned by ``backend.prepare_optimizer``).
        scheduler: the learning-rate scheduler (anything with state_dict() and load_state_dict()).
        train_state: the run's counters; restored in place by :meth:`load`, saved by :meth:`save`.
        extra_files: returns more rank-0 files (name → bytes) to store in every checkpoint, e.g. the modelopt state
            of a quantized model (read back before the model is wrapped, see megatron_bridge.optimization).
        converter: reads the sources this package has no reader for (a Hugging Face folder as
            ``pretrained_checkpoint``); ``pretrain()`` passes the Bridge's (see :mod:`.converter`).
        engine: the run's engine; its ``checkpoint`` side picks the format (default: ``get_engine(cfg)``).
    """

    def __init__(
        self,
        cfg: "ConfigContainer",
        backend: "DataParallelBackend",
        optimizer: torch.optim.Optimizer,
        scheduler: "Stateful",
        train_state: "TrainState",
        extra_files: Callable[[], dict[str, bytes]] | None = None,
        converter: "Converter | None" = None,
        engine: "Engine | None" = None,
    ) -> None:
        from megatron_bridge.engines.factory import get_engine

        self.cfg = cfg
        self.extra_files = extra_files
        self.converter = converter
        self.ckpt = cfg.checkpoint
        self.backend = backend
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.train_state = train_state
        self._group = comm.new_checkpoint_group()
        self._group_retired = False
        self.rank = comm.rank()
        self.world_size = comm.world_size()
        self._pending: _PendingSave | None = None
        self._committer: ThreadPoolExecutor | None = None
        self._abandoned = threading.Event()
        """Set by :meth:`abandon`: a background commit still waiting for its write must not commit."""
        self._commit_lock = threading.Lock()
        """Held by a background commit; :meth:`abandon` waits for one in progress (local file operations)."""
        self._last_saved: tuple[Path, int] | None = None
        """(folder, step) of the newest checkpoint this run loaded or saved; saving it again is skipped."""
        self._locked = False
        """This process (rank 0) holds the lock of ``checkpoint.save`` (see run_folder.py)."""
        self._overwrite_checked = False
        """The save folder was checked for checkpoints this run did not resume from."""
        self.engine = engine if engine is not None else get_engine(cfg)
        self.mcore = self.engine.checkpoint.megatron_core_format
        """megatron-core dist_checkpointing folders (megatron_bridge.checkpoint.mcore_checkpoint), else DCP ones."""
        self._mcore_saves: mcore_checkpoint.AsyncMcoreSaves | None = None
        """The megatron-core engine's async saves (megatron-core's AsyncCallsQueue), created at the first one."""

    # ------------------------------------------------------------------------------------------------- load
    def load(self) -> bool:
        """Resume or initialize from a checkpoint as ``cfg.checkpoint`` says; True when something was loaded.

        Raises:
            CheckpointError: the checkpoint is missing (with exit_on_missing_checkpoint), incomplete, corrupt, or
                its model shapes differ from the model's.
        """
        self._lock_save_folder()
        source = comm.run_on_rank0(lambda: loading.resolve_source(self.ckpt, self.converter), self.group)
        if source is None:
            if self.ckpt.load:
                log_rank_0(logger, "no checkpoint in checkpoint.load=%s: starting fresh", self.ckpt.load)
            self._check_overwrite(None)
            return False
        start = time.perf_counter()
        original, converted_in = source, None
        if foreign.is_foreign(source, self.mcore):  # the other engine's checkpoint: load an exact converted copy
            source, converted_in = foreign.converted_source(source, self.cfg, self.engine, self.converter,
                                                            self.group)
        load_optim = self.ckpt.load_optim and not source.weights_only and source.has_optimizer
        if self.ckpt.load_optim and not source.weights_only and not source.has_optimizer:
            log_rank_0(logger, "checkpoint %s holds no optimizer state: optimizer starts fresh", source.path)
        self._check_engine(source)
        if self.mcore:
            self._load_mcore(source, load_optim)
        else:
            self._load_native(source, load_optim)
        comm.barrier(self.group)
        if converted_in is not None:
            foreign.remove_converted(converted_in, self.group)
            if not original.weights_only:  # resuming it: its step and sample counters too
                self._load_train_state(original)
            source = original
        if not source.weights_only:
            self._last_saved = (Path(source.path).resolve().parent, source.step)
        from_save_folder = bool(self.ckpt.save) and self._last_saved is not None and (
            self._last_saved[0] == Path(self.ckpt.save).resolve())
        self._check_overwrite(source.step if from_save_folder else None)
        log_rank_0(
            logger, "loaded %s %s (step %d, %s) in %.2fs", "weights of" if source.weights_only else "checkpoint",
            source.path, self.train_state.step, source.kind, time.perf_counter() - start,
        )
        return True

    def _check_engine(self, source: loading.LoadSource) -> None:
        """The megatron-core engine's two formats are not interchangeable (a source of the other engine was
        converted to this one's before: :mod:`.foreign`)."""
        if self.mcore and source.kind in loading.MCORE_KINDS:
            self._check_mcore_format(source)

    def _check_mcore_format(self, source: loading.LoadSource) -> None:
        """Megatron FSDP reads fsdp_dtensor folders only, megatron-core DDP torch_dist ones only (megatron-core's
        distributed optimizer has no other sharding type under Megatron FSDP; Megatron-Bridge refuses the same)."""
        fsdp = self.cfg.dist.use_megatron_fsdp
        if fsdp == (source.kind == loading.MCORE_FSDP_DTENSOR):
            return
        if fsdp:
            raise CheckpointError(
                f"{source.path!r} is a megatron-core torch_dist checkpoint, which Megatron FSDP "
                "(dist.use_megatron_fsdp=True) cannot load (megatron-core's optimizer supports only the fsdp_dtensor "
                "sharding type under Megatron FSDP): resume it with megatron-core DDP (dist.use_megatron_fsdp=False) "
                "and checkpoint.ckpt_format='torch_dist'")
        raise CheckpointError(
            f"{source.path!r} is an fsdp_dtensor checkpoint of Megatron FSDP: resume it with "
            "dist.use_megatron_fsdp=True and checkpoint.ckpt_format='fsdp_dtensor'")

    def _load_native(self, source: loading.LoadSource, load_optim: bool) -> None:
        state = self._state_to_load(load_optim)
        if source.kind == "dcp":
            loading.load_dcp(source, state, self.group, self.cfg.model)
        else:
            loading.load_full(source, state, self.cfg.model.padded_vocab_size, self.cfg.model, self.group,
                              self.converter)
        self.backend.load_model_state_dict({k: v for k, v in state.items() if k.startswith("model")})
        if load_optim:
            self.backend.load_optimizer_state_dict(self.optimizer, state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        if not source.weights_only:
            self._restore_run_state(source)

    def _load_mcore(self, source: loading.LoadSource, load_optim: bool) -> None:
        parts = mcore_checkpoint.parts_of(self.cfg, self.backend, self.optimizer, self.scheduler, self.train_state)
        load_rng = self.ckpt.load_rng and not source.weights_only
        reader = mcore_megatron_fsdp if source.kind == loading.MCORE_FSDP_DTENSOR else mcore_checkpoint
        restored = reader.load(parts, source.path, load_optim=load_optim, load_rng=load_rng)
        if source.weights_only:
            return
        self._load_train_state(source)
        if load_rng and not comm.all_ok(restored, self.group):
            warn_once(logger, "rng_not_restored", "RNG states not restored: %s holds none for this run's "
                      "tensor/pipeline-parallel layout", source.path)

    def _load_train_state(self, source: loading.LoadSource) -> None:
        """The train state of a checkpoint folder of either engine (``train_state.pt``; megatron-core folders of
        Megatron-LM without one: its common state, or the folder's step)."""
        if (Path(source.path) / files.TRAIN_STATE_FILENAME).is_file():
            self.train_state.load_state_dict(loading.read_train_state(source.path),
                                             f"{source.path}/{files.TRAIN_STATE_FILENAME}")
        elif source.kind == loading.MCORE_FSDP_DTENSOR:  # Megatron-LM writes no train_state.pt
            log_rank_0(logger, "%s has no train_state.pt: step %d from its folder name, sample counters start at 0",
                       source.path, source.step)
            self.train_state.load_state_dict({"step": source.step})
        else:
            self.train_state.load_state_dict(mcore_checkpoint.train_state_from_common(source.path))

    def _state_to_load(self, load_optim: bool) -> dict:
        state = dict(self.backend.model_state_dict())
        if load_optim:
            state["optimizer"] = self.backend.optimizer_state_dict(self.optimizer)
            state["scheduler"] = self.scheduler.state_dict()
        return state

    def _restore_run_state(self, source: loading.LoadSource) -> None:
        self.train_state.load_state_dict(loading.read_train_state(source.path),
                                         f"{source.path}/{files.TRAIN_STATE_FILENAME}")
        if not self.ckpt.load_rng:
            return
        restored = load_rng_file(source.path, self.rank, self.world_size)
        if not comm.all_ok(restored, self.group):
            warn_once(
                logger, "rng_not_restored",
                "RNG states not restored: the checkpoint was written by %s ranks, this run has %d",
                source.world_size, self.world_size,
            )

    # ------------------------------------------------------------------------------------------------- save
    def should_save(self, step: int) -> bool:
        """True when ``checkpoint.save`` is set and ``step`` is a multiple of ``checkpoint.save_interval``."""
        interval = self.ckpt.save_interval
        return bool(self.ckpt.save) and interval is not None and interval > 0 and step > 0 and step % interval == 0

    def save(self) -> None:
        """Save a checkpoint of ``train_state.step`` into ``checkpoint.save`` (async when checkpoint.async_save).

        A previous async save is finished first. Saving the step that was just loaded or saved is a no-op.
        """
        if not self.ckpt.save:
            return
        self.wait()
        self._lock_save_folder()
        self._check_overwrite(None)
        step = self.train_state.step
        if self._last_saved == (Path(self.ckpt.save).resolve(), step):
            log_rank_0(logger, "checkpoint of step %d already exists in %s: not saving again", step, self.ckpt.save)
            return
        start = time.perf_counter()
        needed = comm.run_on_rank0(self._check_disk_space, self.group)
        job = self._new_job(step)
        try:
            self._write(job, start)
        except DCP_ERRORS as exc:
            if not run_folder.find_enospc(exc):
                raise
            if self.rank == 0:  # free what the failed save wrote; the previous checkpoint is untouched
                shutil.rmtree(job.tmp, ignore_errors=True)
            raise DiskFullError(run_folder.disk_full_message(self.ckpt.save, needed, _free_bytes(job.root))) from exc
        self._last_saved = (Path(self.ckpt.save).resolve(), step)

    def _write(self, job: saving.SaveJob, start: float) -> None:
        step = job.step
        if self.mcore:  # megatron-core writes RNG states into the checkpoint itself
            self._write_mcore(job, start)
            return
        saving.write_rank_files(job.tmp, self.rank, self.world_size, self.ckpt.save_rng)
        files.fault_point("rank_files_written")
        state = saving.collect_state(self.backend, self.optimizer, self.scheduler, self.ckpt.save_optim)
        if self.ckpt.async_save and self.ckpt.ckpt_format in saving.DCP_FORMATS:
            upload = saving.start_async_dcp(state, job.tmp, self.group)
            self._pending = _PendingSave(step, self._committer_pool().submit(self._commit_after, upload, job), start)
            log_rank_0(logger, "started async checkpoint save of step %d (%.2fs blocking)", step,
                       time.perf_counter() - start)
        else:
            self._write_sync(state, job)
            log_rank_0(logger, "saved checkpoint of step %d to %s in %.2fs", step, job.final,
                       time.perf_counter() - start)

    def _write_mcore(self, job: saving.SaveJob, start: float) -> None:
        """megatron-core's dist_checkpointing.save into the temporary folder, then the commit; with async_save the
        commit is the last finalize step of megatron-core's async request (:meth:`poll`, :meth:`wait`)."""
        saving.write_rank_files(job.tmp, self.rank, self.world_size, save_rng=False)
        files.fault_point("rank_files_written")
        parts = mcore_checkpoint.parts_of(self.cfg, self.backend, self.optimizer, self.scheduler, self.train_state)
        if self.ckpt.ckpt_format == "fsdp_dtensor":  # Megatron FSDP: synchronous (rule megatron_fsdp_async_save)
            mcore_megatron_fsdp.save(parts, job.tmp)
            request = None
        else:
            request = mcore_checkpoint.save(parts, job.tmp, async_save=self.ckpt.async_save)
        if request is None:
            self._commit_mcore(job, start)
            return
        if self._mcore_saves is None:
            self._mcore_saves = mcore_checkpoint.AsyncMcoreSaves()
        self._mcore_saves.schedule(request, lambda: self._commit_mcore(job, start))
        log_rank_0(logger, "started async megatron-core checkpoint save of step %d (%.2fs blocking)", job.step,
                   time.perf_counter() - start)

    def _commit_mcore(self, job: saving.SaveJob, start: float) -> None:
        """Every rank, after every rank's files are written: rank 0 commits (manifest, rename, trackers)."""
        comm.barrier(self.group)
        comm.run_on_rank0(lambda: self._finalize_rank0(job), self.group)
        log_rank_0(logger, "saved megatron-core %s checkpoint of step %d to %s in %.2fs", self.ckpt.ckpt_format,
                   job.step, job.final, time.perf_counter() - start)

    def _finalize_mcore(self, blocking: bool) -> None:
        """Finalize the megatron-core engine's finished async saves (all of them with ``blocking``); collective."""
        if self._mcore_saves is None or not self._mcore_saves.pending():
            return
        try:
            self._mcore_saves.finalize(blocking)
        except CheckpointError as exc:
            if run_folder.find_enospc(exc) and not isinstance(exc, DiskFullError):
                raise DiskFullError(run_folder.disk_full_message(self.ckpt.save, None, _free_bytes(self.ckpt.save))
                                    ) from exc
            raise

    # ------------------------------------------------------------------------------------------ run folder
    def _lock_save_folder(self) -> None:
        """Lock ``checkpoint.save`` (rank 0) and remove interrupted saves' folders, once, before loading or saving."""
        if not self.ckpt.save or self._locked:
            return
        root = self.ckpt.save

        def lock_and_clean() -> None:
            run_folder.acquire_lock(root)
            run_folder.clean_interrupted_saves(root)

        comm.run_on_rank0(lock_and_clean, self.group)
        self._locked = True

    def _check_overwrite(self, resumed_step: int | None) -> None:
        """Refuse checkpoints in ``checkpoint.save`` this run did not resume from (once; see run_folder.py)."""
        if not self.ckpt.save or self._overwrite_checked:
            return
        root, overwrite = self.ckpt.save, self.ckpt.overwrite
        try:
            comm.run_on_rank0(lambda: run_folder.check_overwrite(root, resumed_step, overwrite), self.group)
        except CheckpointOverwriteError:
            self._release_lock()  # a refused run leaves no lock in the other run's folder
            raise
        self._overwrite_checked = True

    def _check_disk_space(self) -> int:
        """Rank 0: expected bytes of a save (the newest checkpoint's size, else an estimate from the parameters);
        DiskFullError when the file system has less free."""
        needed = run_folder.committed_size(self.ckpt.save)
        if needed is None:
            params = list(self.backend.parameters())
            needed = sum(p.numel() * p.element_size() for p in params)
            if self.ckpt.save_optim:  # Adam's two fp32 moments
                needed += 8 * sum(p.numel() for p in params)
        run_folder.check_free_space(self.ckpt.save, needed)
        return needed

    def _release_lock(self) -> None:
        if self._locked and self.rank == 0:
            run_folder.release_lock(self.ckpt.save)
        self._locked = False

    def _new_job(self, step: int) -> saving.SaveJob:
        root = Path(self.ckpt.save)
        save_id = comm.broadcast_from_rank0(files.new_save_id(), self.group)
        info = {
            "format": self.ckpt.ckpt_format,
            "backend": getattr(self.backend, "name", type(self.backend).__name__),
            "world_size": self.world_size,
            "has_optimizer": bool(self.ckpt.save_optim),
            "has_rng": bool(self.ckpt.save_rng),
        }
        train_state = self.train_state.state_dict()
        if self.mcore:  # Megatron-Bridge's train_state.pt (0-d tensors), which its loader reads
            info["engine"] = mcore_reader.MCORE_ENGINE
            train_state = mcore_state.train_state_dict(self.train_state)
        return saving.SaveJob(
            root=root, step=step, tmp=files.temporary_dir(root, step, save_id),
            train_state_bytes=saving.serialize(train_state), config_yaml=self.cfg.to_yaml(),
            info=info, extra_files=self.extra_files() if self.extra_files is not None and self.rank == 0 else {},
        )

    def _write_sync(self, state: dict, job: saving.SaveJob) -> None:
        if self.ckpt.ckpt_format in saving.DCP_FORMATS:
            saving.write_dcp(state, job.tmp, self.group)
        else:
            saving.write_torch_file(state, job.tmp, self.rank)
        comm.barrier(self.group)
        comm.run_on_rank0(lambda: self._finalize_rank0(job), self.group)

    def _finalize_rank0(self, job: saving.SaveJob) -> None:
        try:
            saving.finalize_save(job, self.ckpt.most_recent_k)
        except OSError as exc:
            raise CheckpointError(f"committing checkpoint of step {job.step} to {job.root} failed: {exc}") from exc

    def _commit_after(self, upload: Future, job: saving.SaveJob) -> None:
        """Background thread: wait for this rank's DCP writes; rank 0 then commits (all ranks' shards are done
        when rank 0's future completes: DCP writes the metadata only after gathering every rank's results)."""
        upload.result()
        with self._commit_lock:
            if self._abandoned.is_set():
                logger.warning("async checkpoint save of step %d was abandoned: not committed (%s is removed at the "
                               "next start)", job.step, job.tmp)
                return
            if self.rank == 0:
                self._finalize_rank0(job)

    def _committer_pool(self) -> ThreadPoolExecutor:
        if self._committer is None:
            self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-commit")
        return self._committer

    # ------------------------------------------------------------------------------------------- async
    def poll(self) -> None:
        """Finalize a finished async save (non-blocking); raises CheckpointError if it failed."""
        self._finalize_mcore(blocking=False)
        if self._pending is not None and self._pending.future.done():
            self._finish_pending()

    def wait(self) -> None:
        """Block until a pending async save is written and committed."""
        self._finalize_mcore(blocking=True)
        if self._pending is not None:
            self._finish_pending()

    def _finish_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.future.result()
        except CheckpointError:
            raise
        except DCP_ERRORS as exc:
            if run_folder.find_enospc(exc):
                raise DiskFullError(run_folder.disk_full_message(self.ckpt.save, None, _free_bytes(self.ckpt.save))
                                    ) from exc
            msg = dcp_error_message(exc)
            raise CheckpointError(f"async checkpoint save of step {pending.step} failed: {msg}") from exc
        log_rank_0(logger, "async checkpoint of step %d committed (%.2fs after it started)", pending.step,
                   time.perf_counter() - pending.started)

    def abandon(self) -> None:
        """After a failure: drop a pending async save without waiting for it (its ``.tmp`` folder is removed at the
        next start-up; the previous checkpoint stays the latest). Never enters a collective.

        A DCP write in flight runs to its end in its thread (it cannot be interrupted; the commit thread then ends
        without committing); a commit already in progress (rank 0's file operations) is waited for, so the trackers
        name either the previous step or a complete new one. megatron-core's writer processes are killed."""
        self._abandoned.set()
        with self._commit_lock:
            self._pending = None
        if self._mcore_saves is not None:
            self._mcore_saves.abort()
        if self._committer is not None:
            self._committer.shutdown(wait=False, cancel_futures=True)
            self._committer = None
        mcore_checkpoint.stop_writer_processes()
        self._release_lock()

    def close(self) -> None:
        """Wait for pending saves and release the background thread, megatron-core's writer processes and the
        checkpoint group (call at exit, on every rank)."""
        try:
            self.wait()
        finally:
            if self._committer is not None:
                self._committer.shutdown(wait=True)
                self._committer = None
            mcore_checkpoint.stop_writer_processes()
            self._release_lock()
            comm.retire_checkpoint_group(self._group)
            self._group_retired = True

    @property
    def group(self) -> "torch.distributed.ProcessGroup | None":
        """The manager's checkpoint group (``comm.new_checkpoint_group``); :meth:`close` destroys it and a later save
        or load makes a new one (every use is collective, so every rank makes it at the same point)."""
        if self._group_retired:
            self._group, self._group_retired = comm.new_checkpoint_group(), False
        return self._group


def _free_bytes(path: str | Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None
