"""Test-only: writes a checkpoint the way Megatron-Bridge's ``save_checkpoint`` does (``torch_dist``), with
megatron-core's own API and none of this library's checkpoint code, so the tests can check that one resumes here.

Layout (Megatron-Bridge ``training/checkpointing.py``): ``<root>/iter_NNNNNNN/`` written by
``dist_checkpointing.save(state, folder, TorchDistSaveShardedStrategy("torch_dist", 1), content_metadata=...)`` with
``state`` = ``checkpoint_version`` 3.0, ``iteration``, ``model`` (``sharded_state_dict``), ``optimizer``
(``optimizer.sharded_state_dict``), ``opt_param_scheduler`` (megatron-core's ``OptimizerParamScheduler``, counted in
samples), ``rng_state`` (a ``ShardedObject`` over (PP, TP), replica over DP); then ``train_state.pt`` (0-d tensors),
``run_config.yaml``, ``<root>/latest_train_state.pt`` and ``latest_checkpointed_iteration.txt`` (no newline). No
manifest.
"""

import random
import shutil
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


def _rng_state() -> Any:
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    state = {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
             "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": torch.cuda.get_rng_state(),
             "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states()}
    return ShardedObject("rng_state", [state], (ps.get_pipeline_model_parallel_world_size(),
                                                ps.get_tensor_model_parallel_world_size()),
                         (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()),
                         replica_id=ps.get_data_parallel_rank(with_context_parallel=True))


def write_megatron_bridge_checkpoint(ctx: Any, root: Path) -> Path:
    """Save the run of ``ctx`` (a TrainingContext) at its current step as Megatron-Bridge would (all ranks)."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    cfg, step = ctx.cfg, ctx.train_state.step
    folder = root / f"iter_{step:07d}"
    if dist.get_rank() == 0:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    dist.barrier()
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
    return folder
