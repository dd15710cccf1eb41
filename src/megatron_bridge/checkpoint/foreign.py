"""A checkpoint of the other engine given to this one: converted on the fly through the :class:`Converter`.

The two engines store different parameter names and shardings (native DCP vs megatron-core ``dist_checkpointing``,
or Megatron FSDP's ``fsdp_dtensor``, which the native engine gets converted too).
:func:`converted_source` returns, for a source of the other engine's format, a weights-only source of this engine's
format that the loader reads as usual: rank 0 asks the converter (the Bridge,
:mod:`megatron_bridge.bridge.cross_engine`) for an exact copy of the model weights, written under
``checkpoint.save`` (``.converted-<id>``, shared by every node like the checkpoints) or, without a save folder,
the system's temporary folder (one node); :func:`remove_converted` deletes it once every rank has loaded it.

Resuming (``checkpoint.load``) such a checkpoint takes its weights and its train state (step, consumed samples); its
optimizer state does not convert between the engines, so a checkpoint that holds one is refused unless
``checkpoint.load_optim=False`` (the optimizer then starts fresh from the loaded weights), and its RNG states are not
restored.
"""

import shutil
import tempfile
from pathlib import Path

import torch.distributed as dist

from megatron_bridge.checkpoint import comm, files
from megatron_bridge.checkpoint.converter import Converter
from megatron_bridge.checkpoint.load import MCORE_KINDS, LoadSource
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.engines.base import Engine
from megatron_bridge.errors import CheckpointError
from megatron_bridge.utils.logging import get_logger, log_rank_0


logger = get_logger(__name__)


def is_foreign(source: LoadSource, mcore_engine: bool) -> bool:
    """True when ``source`` is in the other engine's format than the run's."""
    return mcore_engine != (source.kind in MCORE_KINDS)


def _refusal(source: LoadSource, cfg: ConfigContainer, engine: Engine,
             converter: Converter | None) -> CheckpointError | None:
    """The error for a foreign source that cannot be converted for ``engine``, else None."""
    side = engine.checkpoint
    other = side.other_engine
    if converter is None:
        return CheckpointError(
            f"{source.path!r} is a {source.kind!r} checkpoint of the model.engine={other!r} format, which this loader "
            "converts only through the Bridge: pretrain() passes it; a CheckpointManager built by hand needs "
            "converter=megatron_bridge.bridge.converter.PretrainedConverter(). Or convert it first with "
            f"scripts/checkpoint/convert.py --to {side.convert_target}")
    if side.megatron_core_format and cfg.dist.use_megatron_fsdp:
        return CheckpointError(
            f"{source.path!r} is a {source.kind!r} source of the {other} engine; under Megatron FSDP "
            "(dist.use_megatron_fsdp=True) the megatron-core engine loads fsdp_dtensor checkpoints only: start from "
            "it with megatron-core DDP (dist.use_megatron_fsdp=False), or with the native engine")
    if not source.weights_only and source.has_optimizer and cfg.checkpoint.load_optim:
        return CheckpointError(
            f"checkpoint.load={source.path!r} was saved by the model.engine={other!r} engine with optimizer state, "
            f"which does not convert to the {engine.name!r} engine's. Fix: set checkpoint.load_optim=False to resume "
            f"its weights (converted exactly) and step with a fresh optimizer, or set model.engine={other!r} to resume "
            "it whole")
    return None


def converted_source(source: LoadSource, cfg: ConfigContainer, engine: Engine, converter: Converter | None,
                     group: dist.ProcessGroup | None) -> tuple[LoadSource, Path]:
    """A weights-only source of this engine's format holding ``source``'s model weights exactly, and the folder it
    lies in (collective: rank 0 converts, every rank gets the copy's path).

    Raises:
        CheckpointError: the source cannot be converted for this engine (names why and the fix).
    """
    error = _refusal(source, cfg, engine, converter)
    if error is not None or converter is None:
        raise error or CheckpointError("no converter")
    convert_for_engine = converter.convert_for_engine

    def convert() -> tuple[str, str, str]:
        out = files.conversion_dir(cfg.checkpoint.save) if cfg.checkpoint.save else Path(
            tempfile.mkdtemp(prefix="megatron_bridge_converted-"))
        try:
            path, kind = convert_for_engine(source.path, source.kind, cfg.model, engine.name, out)
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)
            raise
        return path, kind, str(out)

    log_rank_0(logger, "%s is a %s checkpoint of the other engine: converting its weights for model.engine=%r",
               source.path, source.kind, engine.name)
    path, kind, out = comm.run_on_rank0(convert, group)
    return LoadSource(path, kind, source.step, True), Path(out)


def remove_converted(folder: Path, group: dist.ProcessGroup | None) -> None:
    """Delete the converted copy's folder (rank 0, after every rank has loaded it)."""
    comm.run_on_rank0(lambda: shutil.rmtree(folder, ignore_errors=True), group)
