"""The state dict of a megatron-core engine checkpoint, laid out as Megatron-Bridge's ``generate_state_dict`` does.

=============================================  ======================================================================
key                                            content
=============================================  ======================================================================
``checkpoint_version``                         ``3.0``
``iteration``                                  the step
``num_floating_point_operations_so_far``       FLOPs so far (Megatron-LM's key; Megatron-Bridge keeps it in
                                               ``train_state.pt`` only, and ignores it here)
``model`` (``model0``, ``model1``.. per        ``GPTModel.sharded_state_dict(metadata=...)`` of the unwrapped chunk
virtual stage)
``optimizer``                                  megatron-core's ``optimizer.sharded_state_dict(model_sd, metadata=...)``
                                               (the distributed optimizer's ``dp_reshardable`` or
                                               ``fully_reshardable`` parameter state; under FSDP2
                                               :mod:`.mcore_torch_fsdp2` builds the same)
``opt_param_scheduler``                        Megatron's ``OptimizerParamScheduler`` fields, counted in samples
``rng_state``                                  ``ShardedObject("rng_state", [states], (PP, TP), (pp_rank, tp_rank),
                                               replica_id=dp_rank)``; states: ``random_rng_state``,
                                               ``np_rng_state``, ``torch_rng_state``, ``cuda_rng_state``,
                                               ``rng_tracker_states``
``content_metadata`` (added by megatron-core)  the sharding flags of :func:`content_metadata`
=============================================  ======================================================================

``train_state.pt`` holds Megatron-Bridge's ``TrainState`` as 0-d tensors (:func:`train_state_dict`).
"""

import random
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from megatron_bridge.checkpoint import mcore_torch_fsdp2
from megatron_bridge.errors import CheckpointError


if TYPE_CHECKING:
    from megatron_bridge.checkpoint.train_state import TrainState
    from megatron_bridge.config.container import ConfigContainer

CHECKPOINT_VERSION = 3.0
"""Megatron-LM's ``checkpoint_version`` of torch_dist checkpoints."""
RNG_KEY = "rng_state"
_SCHEDULER_SAMPLE_KEYS = {"lr_warmup_steps": "warmup_steps", "lr_decay_steps": "decay_steps", "num_steps": "num_steps"}
"""Megatron's scheduler counters (samples) and ours (steps)."""


def content_metadata(cfg: "ConfigContainer") -> dict[str, Any]:
    """The sharding flags Megatron-Bridge stores as ``content_metadata`` (``_build_sharded_state_dict_metadata``):
    the distributed optimizer's ``distrib_optim_sharding_type`` (``checkpoint.dist_ckpt_optim_fully_reshardable``
    picks ``fully_reshardable`` over ``dp_reshardable``), ``singleton_local_shards``, ``chained_optim_avoid_prefix``."""
    metadata: dict[str, Any] = {}
    if cfg.optimizer.use_distributed_optimizer:
        if cfg.checkpoint.dist_ckpt_optim_fully_reshardable:
            metadata["distrib_optim_sharding_type"] = "fully_reshardable"
            metadata["distrib_optim_fully_reshardable_mem_efficient"] = False
        else:
            metadata["distrib_optim_sharding_type"] = "dp_reshardable"
    metadata["singleton_local_shards"] = False
    metadata["chained_optim_avoid_prefix"] = True
    return metadata


def with_process_groups(metadata: dict[str, Any]) -> dict[str, Any]:
    """``metadata`` plus the data-parallel group (``dp_cp_group``) that transformer-engine layers read; never saved."""
    from megatron.core import parallel_state as ps

    return {**metadata, "dp_cp_group": ps.get_data_parallel_group(with_context_parallel=True)}


# ----------------------------------------------------------------------------------------------------- RNG
def rng_sharded_object(state: list[dict[str, Any]] | None = None) -> Any:
    """This rank's RNG states as Megatron-Bridge's ``rng_state`` ``ShardedObject`` (``state`` None: the current
    states; pass a loaded value only to address the object)."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    if state is None:
        state = [{
            "random_rng_state": random.getstate(),
            "np_rng_state": np.random.get_state(),
            "torch_rng_state": torch.get_rng_state(),
            "cuda_rng_state": torch.cuda.get_rng_state(),
            "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states(),
        }]
    shape = (ps.get_pipeline_model_parallel_world_size(), ps.get_tensor_model_parallel_world_size())
    offset = (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank())
    return ShardedObject(RNG_KEY, state, shape, offset,
                         replica_id=ps.get_data_parallel_rank(with_context_parallel=True))


def set_rng_state(loaded: Any) -> None:
    """Restore the states of :func:`rng_sharded_object` (Megatron-Bridge's ``load_checkpoint`` order)."""
    from megatron.core import tensor_parallel

    try:
        state = loaded[0]
        random.setstate(state["random_rng_state"])
        np.random.set_state(state["np_rng_state"])
        torch.set_rng_state(state["torch_rng_state"])
        torch.cuda.set_rng_state(state["cuda_rng_state"])
        tracker = tensor_parallel.get_cuda_rng_tracker()
        graph_safe = tensor_parallel.is_graph_safe_cuda_rng_tracker(tracker)
        tracker.set_states({k: tensor_parallel.convert_cuda_rng_state(v, to_graphable=graph_safe)
                            for k, v in state["rng_tracker_states"].items()})
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"the checkpoint's rng_state is malformed ({type(exc).__name__}: {exc}): set "
                              "checkpoint.load_rng=False to start with fresh RNG states") from exc


def rng_key_in(metadata: Any) -> bool:
    """True when the checkpoint holds this rank's ``rng_state`` (written with the same TP and PP sizes)."""
    return rng_sharded_object([{}]).unique_key in metadata.state_dict_metadata


# ------------------------------------------------------------------------------------- scheduler, train state
def scheduler_to_megatron(state: dict[str, Any], cfg: "ConfigContainer") -> dict[str, Any]:
    """Our scheduler state as Megatron's ``OptimizerParamScheduler.state_dict()`` (counters in samples: steps ×
    ``train.global_batch_size``; ``wd_incr_steps`` = ``train_iters`` × global batch, as Megatron-Bridge sets it)."""
    gbs = cfg.train.global_batch_size
    out = {mega: state[ours] * gbs for mega, ours in _SCHEDULER_SAMPLE_KEYS.items()}
    out.update(max_lr=state["max_lr"], min_lr=state["min_lr"], lr_decay_style=state["decay_style"],
               start_wd=state["start_wd"], end_wd=state["end_wd"],
               wd_incr_style=cfg.scheduler.weight_decay_incr_style, wd_incr_steps=cfg.train_iters * gbs)
    return out


def scheduler_from_megatron(state: Any, cfg: "ConfigContainer") -> dict[str, Any]:
    """Megatron's scheduler state as ours (samples ÷ ``train.global_batch_size``).

    Raises:
        CheckpointError: a field is missing, or the step counter is not a whole number of global batches.
    """
    gbs = cfg.train.global_batch_size
    try:
        out = {ours: state[mega] / gbs for mega, ours in _SCHEDULER_SAMPLE_KEYS.items()}
        out.update(max_lr=state["max_lr"], min_lr=state["min_lr"], decay_style=state["lr_decay_style"],
                   start_wd=state["start_wd"], end_wd=state["end_wd"])
    except (KeyError, TypeError) as exc:
        raise CheckpointError(f"the checkpoint's opt_param_scheduler lacks {exc}: set checkpoint.load_optim=False "
                              "to start the optimizer and schedule fresh") from exc
    if out["num_steps"] != int(out["num_steps"]):
        raise CheckpointError(
            f"the checkpoint's opt_param_scheduler counted {state['num_steps']} samples, not a multiple of "
            f"train.global_batch_size={gbs}: resume with the global batch size it was trained with")
    for key in _SCHEDULER_SAMPLE_KEYS.values():
        if out[key] == int(out[key]):
            out[key] = int(out[key])
    return out


def train_state_dict(state: "TrainState") -> dict[str, torch.Tensor]:
    """``TrainState`` as Megatron-Bridge's ``TrainState.state_dict()`` writes it (0-d tensors, its eight keys)."""
    return {
        "step": torch.tensor(state.step, dtype=torch.int64),
        "consumed_train_samples": torch.tensor(state.consumed_train_samples, dtype=torch.int64),
        "skipped_train_samples": torch.tensor(state.skipped_train_samples, dtype=torch.int64),
        "consumed_valid_samples": torch.tensor(state.consumed_valid_samples, dtype=torch.int64),
        "floating_point_operations_so_far": torch.tensor(state.floating_point_operations_so_far,
                                                         dtype=torch.float64),
        "do_train": torch.tensor(False), "do_valid": torch.tensor(False), "do_test": torch.tensor(False),
    }


# ----------------------------------------------------------------------------------------------- optimizer
def ensure_optimizer_state(optimizer: Any) -> None:
    """Give every parameter of megatron-core's optimizer(s) a state to load into, as a first step would (zeros and
    ``step`` 0): without transformer-engine or Apex, megatron-core reads ``step`` from every state when building the
    sharded state dict to load, and a fresh torch Adam has none."""
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if inner is None:
            continue
        empty = [p for group in inner.param_groups for p in group["params"] if len(inner.state[p]) == 0]
        if not empty:
            continue
        init = getattr(opt, "init_state_fn", None)
        if init is not None:
            init(inner, getattr(opt, "config", None))
        for p in empty:
            inner.state[p].setdefault("step", torch.tensor(0.0, dtype=torch.float32))


def untie_optimizer_steps(optimizer: Any) -> None:
    """After loading megatron-core's distributed optimizer without transformer-engine or Apex: give every torch-Adam
    parameter state its own ``step`` tensor, set to its parameter group's ``step`` (the value the checkpoint saved).
    megatron-core 0.19 assigns one shared tensor to all states (torch Adam then adds 1 to it once per parameter and
    step) and copies an unsaved placeholder into it from the bucket-space parameter state."""
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if inner is None:
            continue
        for group in inner.param_groups:
            if "step" not in group:
                continue
            for p in group["params"]:
                state = inner.state.get(p)
                if state and "step" in state:
                    state["step"] = torch.tensor(float(group["step"]), dtype=torch.float32)


# ---------------------------------------------------------------------------------------------- state dict
def model_keys(n_chunks: int) -> list[str]:
    """``["model"]`` for one chunk, else ``["model0", "model1", ...]`` (Megatron's names)."""
    return ["model"] if n_chunks == 1 else [f"model{i}" for i in range(n_chunks)]


def build_state_dict(cfg: "ConfigContainer", chunks: list[torch.nn.Module], optimizer: Any, scheduler: Any,
                     train_state: "TrainState", metadata: dict[str, Any], *, is_loading: bool, with_optim: bool,
                     with_rng: bool) -> dict[str, Any]:
    """The sharded state dict to save or to load into (module docstring). ``chunks`` are the unwrapped
    ``GPTModel`` chunks; ``metadata`` the content metadata (with process groups)."""
    state: dict[str, Any] = {"checkpoint_version": CHECKPOINT_VERSION, "iteration": train_state.step,
                             "num_floating_point_operations_so_far": train_state.floating_point_operations_so_far}
    for key, chunk in zip(model_keys(len(chunks)), chunks, strict=True):
        state[key] = chunk.sharded_state_dict(metadata=metadata)
    if with_optim:
        if is_loading:
            ensure_optimizer_state(optimizer)
        if any(mcore_torch_fsdp2.is_fsdp2_chunk(chunk) for chunk in chunks):
            state["optimizer"] = mcore_torch_fsdp2.optimizer_sharded_state_dict(optimizer, state, metadata,
                                                                                is_loading=is_loading)
        else:
            state["optimizer"] = optimizer.sharded_state_dict(state, metadata=metadata, is_loading=is_loading)
        state["opt_param_scheduler"] = scheduler_to_megatron(scheduler.state_dict(), cfg)
    if with_rng:
        state[RNG_KEY] = rng_sharded_object()
    return state
