"""Checkpoints of Megatron FSDP around megatron-core chunks (``model.engine="megatron_core"``,
``dist.use_megatron_fsdp=True``) in the ``fsdp_dtensor`` format, as Megatron-Bridge and Megatron-LM write it.

A plain PyTorch DCP folder (``.metadata`` + ``__<rank>_0.distcp``; no megatron-core ``metadata.json``) of the state
dict Megatron-Bridge's ``generate_state_dict`` builds for ``ckpt_format="fsdp_dtensor"``:

=============================================  ======================================================================
key                                            content
=============================================  ======================================================================
``checkpoint_version``, ``iteration``          ``3.0``, the step
``model`` (``model0``.. per virtual stage)     the DTensor shards megatron-fsdp's ``MegatronFSDP`` puts into the
                                               ``GPTModel`` (its main weights), under the adapter's
                                               ``state_dict_for_save_checkpoint()`` names (``module.decoder...``),
                                               without ``_extra_state``
``optimizer``                                  megatron-core's ``optimizer.sharded_state_dict(metadata=
                                               {"distrib_optim_sharding_type": "fsdp_dtensor"})``: ``state`` (Adam
                                               moments as DTensors, ``step``) and ``param_to_group_meta``, by
                                               parameter name
``opt_param_scheduler``                        Megatron's ``OptimizerParamScheduler`` fields (samples)
``rng_state``                                  ``{"(pp_rank, tp_rank)": [states]}`` (Megatron-Bridge's
                                               ``get_rng_state`` for fsdp_dtensor)
=============================================  ======================================================================

Before writing (and before reading), megatron-core's own preprocessing runs as in Megatron-Bridge's
``preprocess_fsdp_dtensor_state_dict``: SwiGLU ``linear_fc1`` split into ``weight_w`` / ``weight_v`` (resharding
across TP sizes), expert re-indexing, uneven-DTensor chunk metadata (:mod:`.mcore_megatron_fsdp_preprocess`, with its
fixes for megatron-core 0.19: optim / optim_grads, bf16, no_shard). Reading goes through the allow-listed DCP metadata
reader and a planner that reads every non-tensor value with ``torch.load(weights_only=True)`` (NumPy RNG arrays
allowed; see :mod:`.mcore_reader`) — DCP's default planner would unpickle them without restriction.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint import save as dcp_save

from megatron_bridge.checkpoint import mcore_state, saved_run
from megatron_bridge.checkpoint.mcore_megatron_fsdp_preprocess import complete_optimizer_state, preprocess
from megatron_bridge.checkpoint.mcore_reader import SafeMegatronLoadPlanner
from megatron_bridge.checkpoint.reader import (
    DCP_ERRORS,
    SafeFileSystemReader,
    check_dcp_storage,
    dcp_error_message,
    read_dcp_metadata,
)
from megatron_bridge.errors import CheckpointError


if TYPE_CHECKING:
    from megatron_bridge.checkpoint.mcore_checkpoint import McoreParts

FORMAT = "fsdp_dtensor"
CONTENT_METADATA = {"distrib_optim_sharding_type": "fsdp_dtensor", "singleton_local_shards": False,
                    "chained_optim_avoid_prefix": True}
"""Megatron-Bridge's ``_build_sharded_state_dict_metadata`` for fsdp_dtensor with the distributed optimizer (always
on under Megatron FSDP)."""


def _fsdp_modules(parts: "McoreParts") -> list[torch.nn.Module]:
    """megatron-fsdp's ``MegatronFSDP`` inside each adapter chunk (megatron-core's ``unwrap_model`` result)."""
    return [getattr(chunk, "module", chunk) for chunk in parts.wrapped]


def rng_state() -> dict[str, list[dict[str, Any]]]:
    """This rank's RNG states keyed ``"(pp_rank, tp_rank)"`` (Megatron-Bridge's fsdp_dtensor ``rng_state``)."""
    from megatron.core import parallel_state as ps

    states = mcore_state.rng_sharded_object().data
    return {f"({ps.get_pipeline_model_parallel_rank()}, {ps.get_tensor_model_parallel_rank()})": states}


def _model_state(module: torch.nn.Module) -> dict[str, Any]:
    """The DTensor shards of ``MegatronFSDP.state_dict()`` under its names (``module.<GPTModel name>``: what
    Megatron-Bridge's ``state_dict_for_save_checkpoint()`` of megatron-core's adapter gives; ``Float16Module`` adds no
    level), without the ``_extra_state`` entries (megatron-core's ``handle_fp8_extra_state_case``; without
    transformer-engine they are None)."""
    return {k: v for k, v in module.state_dict().items() if not k.endswith("._extra_state")}


def build_state_dict(parts: "McoreParts", *, is_loading: bool, with_optim: bool, with_rng: bool) -> dict[str, Any]:
    """The raw state dict (module docstring) before megatron-core's preprocessing."""
    modules = _fsdp_modules(parts)
    state: dict[str, Any] = {"checkpoint_version": mcore_state.CHECKPOINT_VERSION, "iteration": parts.train_state.step}
    for key, module in zip(mcore_state.model_keys(len(modules)), modules, strict=True):
        state[key] = _model_state(module)
    if with_optim:
        state["optimizer"] = parts.optimizer.sharded_state_dict(state, metadata=dict(CONTENT_METADATA),
                                                                is_loading=is_loading)
        complete_optimizer_state(parts.optimizer, state["optimizer"])
        state["opt_param_scheduler"] = mcore_state.scheduler_to_megatron(parts.scheduler.state_dict(), parts.cfg)
    if with_rng:
        state[mcore_state.RNG_KEY] = rng_state()
    return state


def save(parts: "McoreParts", folder: Path) -> None:
    """Write the checkpoint into ``folder`` with ``torch.distributed.checkpoint.save`` (collective: every rank)."""
    ckpt = parts.cfg.checkpoint
    state = build_state_dict(parts, is_loading=False, with_optim=ckpt.save_optim, with_rng=ckpt.save_rng)
    state = preprocess(state, _fsdp_modules(parts)[0])
    try:
        dcp_save(state, storage_writer=FileSystemWriter(str(folder)))
    except CheckpointError:
        raise
    except DCP_ERRORS as exc:
        raise CheckpointError(f"fsdp_dtensor save into {str(folder)!r} failed: {dcp_error_message(exc)}") from exc


# ------------------------------------------------------------------------------------------------------ load
def is_fsdp_dtensor_folder(folder: str | Path) -> bool:
    """A DCP folder without megatron-core's ``metadata.json`` whose keys are Megatron's (``checkpoint_version``,
    ``model.``..):
    what Megatron-Bridge and Megatron-LM write for ``ckpt_format="fsdp_dtensor"``."""
    from megatron_bridge.checkpoint.mcore_reader import is_mcore_checkpoint

    folder = Path(folder)
    if is_mcore_checkpoint(folder) or not (folder / ".metadata").is_file():
        return False
    keys = read_dcp_metadata(folder).state_dict_metadata
    return "checkpoint_version" in keys and any(k.startswith(("model.", "model0.")) for k in keys)


def has_optimizer_state(folder: str | Path) -> bool:
    """True when the folder's DCP metadata holds optimizer tensors."""
    return any(k.startswith("optimizer.") for k in read_dcp_metadata(folder).state_dict_metadata)


def _check_keys(state: dict[str, Any], stored: dict[str, Any], folder: str | Path) -> None:
    """CheckpointError naming the tensors the checkpoint lacks or holds with another global shape."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    flat, _ = flatten_state_dict(state)
    missing = sorted(k for k in flat if k not in stored)
    different = sorted(k for k, v in flat.items() if k in stored and isinstance(v, torch.Tensor)
                       and hasattr(stored[k], "size") and tuple(stored[k].size) != tuple(v.shape))
    if not (missing or different):
        return
    parts = []
    if different:
        parts.append(f"{len(different)} shape mismatch(es): " + ", ".join(
            f"{k}: checkpoint {list(stored[k].size)} vs model {list(flat[k].shape)}" for k in different[:8]))
    if missing:
        parts.append(f"{len(missing)} key(s) missing from the checkpoint: {missing[:8]}")
    raise CheckpointError(f"fsdp_dtensor checkpoint {str(folder)!r} does not fit the model: " + "; ".join(parts))


def load(parts: "McoreParts", folder: str | Path, *, load_optim: bool, load_rng: bool) -> bool:
    """Restore model (and with ``load_optim`` optimizer and schedule; with ``load_rng`` RNG states) from an
    fsdp_dtensor folder. Returns True when the RNG states were restored. Collective (every rank).

    Raises:
        CheckpointError: incomplete, corrupt, disallowed objects, or the checkpoint does not fit the model;
            PrecisionMismatchError (with ``load_optim``): its run_config.yaml records another mixed_precision.
    """
    from megatron.core import parallel_state as ps

    metadata = read_dcp_metadata(folder)
    check_dcp_storage(folder, metadata)
    if load_optim:  # run_config.yaml decides: megatron-fsdp's model tensors need not be in the compute dtype
        saved_run.check_precision(parts.cfg, folder)
    stored = metadata.state_dict_metadata
    key = f"({ps.get_pipeline_model_parallel_rank()}, {ps.get_tensor_model_parallel_rank()})"
    with_rng = load_rng and any(k.startswith(f"{mcore_state.RNG_KEY}.{key}.") for k in stored)
    raw = build_state_dict(parts, is_loading=True, with_optim=load_optim, with_rng=with_rng)
    state = preprocess(raw, _fsdp_modules(parts)[0])
    _check_keys({k: v for k, v in state.items() if k != mcore_state.RNG_KEY}, stored, folder)
    try:
        dcp_load(state, storage_reader=SafeFileSystemReader(str(folder)), planner=SafeMegatronLoadPlanner())
    except CheckpointError:
        raise
    except DCP_ERRORS as exc:
        raise CheckpointError(f"reading fsdp_dtensor checkpoint {str(folder)!r} failed: "
                              f"{dcp_error_message(exc)}") from exc
    modules = _fsdp_modules(parts)
    for model_key, module in zip(mcore_state.model_keys(len(modules)), modules, strict=True):
        _load_model(module, raw[model_key], folder)
    if load_optim:
        with torch.no_grad():
            parts.optimizer.load_state_dict(raw["optimizer"])
        parts.scheduler.load_state_dict(mcore_state.scheduler_from_megatron(state["opt_param_scheduler"], parts.cfg))
    for module in modules:  # the loaded main weights into the compute weights, gathered (as after a step)
        module.param_and_grad_buffer.copy_main_weights_to_model_weights()
        module.start_param_sync(force_sync=True)
    if with_rng:
        mcore_state.set_rng_state(state[mcore_state.RNG_KEY][key])
    return with_rng


def _load_model(module: torch.nn.Module, state: dict[str, Any], folder: str | Path) -> None:
    """The loaded shards into ``MegatronFSDP`` (its ``load_state_dict`` runs megatron-fsdp's post-load hook). With
    bf16/fp16 its names pass through ``Float16Module`` (``module.module.``), whose ``state_dict`` skips that level
    but whose ``load_state_dict`` does not. DCP wrote into the parameters' own shards already; this checks that
    every key fits."""
    from megatron_bridge.engines.megatron_core.precision import unwrap_float16

    prefix = "module." if unwrap_float16(module.module) is module.module else "module.module."
    renamed = {prefix + k.removeprefix("module."): v for k, v in state.items()}
    try:
        result = module.load_state_dict(renamed, strict=False)
    except RuntimeError as exc:
        raise CheckpointError(f"fsdp_dtensor checkpoint {str(folder)!r} does not fit the model: {exc}") from exc
    missing = [k for k in result.missing_keys if not k.endswith("._extra_state")]
    if missing or result.unexpected_keys:
        raise CheckpointError(f"fsdp_dtensor checkpoint {str(folder)!r} does not fit the model: missing "
                              f"{missing[:8]}, unexpected {result.unexpected_keys[:8]}")
