"""Test-only: writes a checkpoint the way Megatron-Bridge's ``save_checkpoint`` does (``torch_dist``), with
megatron-core's own API and none of this library's checkpoint code, so the tests can check that one resumes here.

Layout (Megatron-Bridge ``training/checkpointing.py``): ``<root>/iter_NNNNNNN/`` written by
``dist_checkpointing.save(state, folder, TorchDistSaveShardedStrategy("torch_dist", 1), content_metadata=...)`` with
``state`` = ``checkpoint_version`` 3.0, ``iteration``, ``model`` (``sharded_state_dict``), ``optimizer``
(``optimizer.sharded_state_dict``), ``opt_param_scheduler`` (megatron-core's ``OptimizerParamScheduler``, counted in
samples), ``rng_state`` (a ``ShardedObject`` over (PP, TP), replica over DP); then ``train_state.pt`` (0-d tensors),
``run_config.yaml``, ``<root>/latest_train_state.pt`` and ``latest_checkpointed_iteration.txt`` (no newline). No
manifest.

:func:`write_megatron_bridge_fsdp_dtensor_checkpoint` writes Megatron-Bridge's ``ckpt_format="fsdp_dtensor"``
folder under Megatron FSDP (``generate_state_dict``, ``preprocess_fsdp_dtensor_state_dict``,
``save_fsdp_dtensor_checkpoint``): ``model`` is the adapter's ``state_dict_for_save_checkpoint()``, ``optimizer``
the optimizer's ``sharded_state_dict`` with ``distrib_optim_sharding_type="fsdp_dtensor"``, ``rng_state`` a plain
``{"(pp_rank, tp_rank)": [states]}``; megatron-core's own handlers (extra state dropped, SwiGLU split with the
adapter as the model, uneven-DTensor metadata), then ``torch.distributed.checkpoint.save`` into a plain DCP folder
(no ``metadata.json``); the same train state, run config and trackers.
"""

import random
import shutil
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml


def _scheduler_state(cfg: Any, step: int) -> dict[str, Any]:
    """megatron-core's own scheduler, configured as Megatron-Bridge derives it from the config, at ``step``."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    gbs = cfg.train.global_batch_size
    o, s = cfg.optimizer, cfg.scheduler
    scheduler = OptimizerParamScheduler(
        SimpleNamespace(param_groups=[{"params": []}]), init_lr=s.lr_warmup_init, max_lr=o.lr, min_lr=o.min_lr,
        lr_warmup_steps=cfg.lr_warmup_iters * gbs, lr_decay_steps=cfg.lr_decay_iters * gbs,
        lr_decay_style=s.lr_decay_style, start_wd=o.weight_decay, end_wd=o.weight_decay,
        wd_incr_steps=cfg.train_iters * gbs, wd_incr_style=s.weight_decay_incr_style)
    scheduler.step(increment=step * gbs)
    return scheduler.state_dict()


def _rng_states() -> dict[str, Any]:
    from megatron.core import tensor_parallel

    return {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
            "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": torch.cuda.get_rng_state(),
            "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states()}


def _rng_state() -> Any:
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    return ShardedObject("rng_state", [_rng_states()], (ps.get_pipeline_model_parallel_world_size(),
                                                ps.get_tensor_model_parallel_world_size()),
                         (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()),
                         replica_id=ps.get_data_parallel_rank(with_context_parallel=True))


def _new_folder(root: Path, step: int) -> Path:
    folder = root / f"iter_{step:07d}"
    if dist.get_rank() == 0:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    dist.barrier()
    return folder


def write_megatron_bridge_checkpoint(ctx: Any, root: Path) -> Path:
    """Save the run of ``ctx`` (a TrainingContext) at its current step as Megatron-Bridge would (all ranks)."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    cfg, step = ctx.cfg, ctx.train_state.step
    folder = _new_folder(root, step)
    metadata = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    if cfg.optimizer.use_distributed_optimizer:
        metadata["distrib_optim_sharding_type"] = "dp_reshardable"
    model = ctx.backend.unwrap(ctx.backend.chunks[0])
    state: dict[str, Any] = {"checkpoint_version": 3.0, "iteration": step,
                             "model": model.sharded_state_dict(metadata=metadata)}
    state["optimizer"] = ctx.optimizer.sharded_state_dict(state, metadata=metadata)
    state["opt_param_scheduler"] = _scheduler_state(cfg, step)
    state["rng_state"] = _rng_state()
    dist_checkpointing.save(state, str(folder), TorchDistSaveShardedStrategy("torch_dist", 1),
                            content_metadata=metadata)
    _finish(ctx, root, folder)
    return folder


def write_megatron_bridge_fsdp_dtensor_checkpoint(ctx: Any, root: Path) -> Path:
    """Save the Megatron FSDP run of ``ctx`` at its current step as Megatron-Bridge's fsdp_dtensor save would (all
    ranks; module docstring)."""
    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core.distributed.fsdp.src.megatron_fsdp.uneven_dtensor import (
        preprocess_state_dict_for_uneven_dtensor,
    )
    from megatron.core.transformer.fsdp_dtensor_checkpoint import (
        handle_fp8_extra_state_case,
        handle_swiglu_in_state_dict,
    )
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint import save as dcp_save

    cfg, step = ctx.cfg, ctx.train_state.step
    folder = _new_folder(root, step)
    model = ctx.backend.chunks[0]  # megatron-core's FullyShardedDataParallel adapter
    metadata = {"distrib_optim_sharding_type": "fsdp_dtensor", "singleton_local_shards": False,
                "chained_optim_avoid_prefix": True}
    state: dict[str, Any] = {"checkpoint_version": 3.0, "iteration": step,
                             "model": model.state_dict_for_save_checkpoint()}
    with _every_parameter_has_adam_state(ctx.optimizer.optimizer):
        state["optimizer"] = ctx.optimizer.sharded_state_dict(state, metadata=metadata)
    state["opt_param_scheduler"] = _scheduler_state(cfg, step)
    state["rng_state"] = {f"({ps.get_pipeline_model_parallel_rank()}, {ps.get_tensor_model_parallel_rank()})":
                          [_rng_states()]}
    handle_fp8_extra_state_case(state["model"])
    if model.config.gated_linear_unit and model.config.activation_func is F.silu:
        state["model"], state["optimizer"] = handle_swiglu_in_state_dict(_Lookup(model), state["model"],
                                                                         state["optimizer"])
    preprocess_state_dict_for_uneven_dtensor(state)
    dcp_save(state, storage_writer=FileSystemWriter(str(folder)))
    _finish(ctx, root, folder)
    return folder


@contextmanager
def _every_parameter_has_adam_state(adam: torch.optim.Optimizer) -> Iterator[None]:
    """Adam state for every parameter, in parameter order, as transformer-engine's FusedAdam keeps it on the GPUs
    Megatron-Bridge runs on. torch's Adam (megatron-core's CPU fallback) keeps none for a parameter whose shard on
    this rank is empty (megatron-fsdp shards unevenly), and megatron-core's preprocessing then runs different
    collectives on the two ranks (measured: a hang). The moments added are empty; the original state returns
    afterwards."""
    original = adam.state
    step = next(s["step"] for s in original.values() if "step" in s)
    params = [p for group in adam.param_groups for p in group["params"]]
    adam.state = defaultdict(dict, {p: original[p] if p in original else {
        "step": step.clone(), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)} for p in params})
    try:
        yield
    finally:
        adam.state = original


class _Lookup(torch.nn.Module):
    """The adapter as megatron-core 0.19.2's SwiGLU handler needs it. Megatron-Bridge passes the adapter itself, and
    the handler then resolves the model keys (``module.<name>`` → ``module.module.<name>``) but not the optimizer's
    (``module.module.<name>`` less one ``module.``; measured: "MegatronFSDP has no attribute `decoder`"), so a
    SwiGLU model's save with optimizer state fails there upstream. Same parameters, any number of ``module.``."""

    def __init__(self, adapter: torch.nn.Module) -> None:
        super().__init__()
        self.module = adapter

    def get_parameter(self, target: str) -> torch.nn.Parameter:
        gpt = self.module.module.module  # adapter → MegatronFSDP → GPTModel (fp32; no Float16Module here)
        while target.startswith("module."):
            target = target[len("module."):]
        return gpt.get_parameter(target)


def _finish(ctx: Any, root: Path, folder: Path) -> None:
    """Rank 0: ``train_state.pt``, ``run_config.yaml`` and the trackers, after every rank wrote its shards."""
    cfg, step = ctx.cfg, ctx.train_state.step
    dist.barrier()
    if dist.get_rank() == 0:
        ts = ctx.train_state
        train_state = {"step": torch.tensor(step), "consumed_train_samples": torch.tensor(ts.consumed_train_samples),
                       "skipped_train_samples": torch.tensor(0), "consumed_valid_samples": torch.tensor(0),
                       "floating_point_operations_so_far": torch.tensor(ts.floating_point_operations_so_far,
                                                                        dtype=torch.float64),
                       "do_train": torch.tensor(True), "do_valid": torch.tensor(False),
                       "do_test": torch.tensor(False)}
        torch.save(train_state, folder / "train_state.pt")
        shutil.copy(folder / "train_state.pt", root / "latest_train_state.pt")
        model = {"_target_": "megatron.bridge.models.GPTModelProvider", "pipeline_model_parallel_size": 1,
                 "tensor_model_parallel_size": cfg.model.tensor_model_parallel_size}
        run_config = {"model": model,
                      "checkpoint": {"save_optim": True, "save_rng": True, "fully_parallel_save": True}}
        (folder / "run_config.yaml").write_text(yaml.safe_dump(run_config))
        (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    dist.barrier()
