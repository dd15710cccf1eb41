"""``torch_dist`` checkpoints of megatron-core chunks under PyTorch FSDP2 (``dist.use_torch_fsdp2`` with
``model.engine="megatron_core"``), in the format Megatron-LM and Megatron-Bridge write for it.

megatron-core's ``TorchFullyShardedDataParallel`` marks every parameter ``is_torch_fsdp2_param``; the model's own
``sharded_state_dict`` then addresses each rank's FSDP2 shard (dim 0, over the data-parallel group, after the
tensor-parallel split) as a ``ShardedTensor`` of the *same* global tensor megatron-core DDP saves
(``megatron.core.utils.make_tp_sharded_tensor_for_checkpoint``; the SwiGLU ``linear_fc1`` keeps the ``[W; V]``
order). So a checkpoint saved under FSDP2 loads under megatron-core DDP and back (with the non-distributed optimizer
on both sides: FSDP2 refuses the distributed one, as Megatron-LM does).

Two steps differ from megatron-core DDP:

* **Optimizer state dict.** megatron-core (0.19) maps optimizer parameters to the model's ``ShardedTensor``\\ s by
  the identity of ``DTensor.to_local()``; since torch 2.10 (pytorch/pytorch#166156) ``to_local()`` of a
  ``Parameter(DTensor)`` returns a fresh view, so megatron-core's ``optimizer.sharded_state_dict`` fails with "Param
  id 0 does not match any model sharded param". :func:`optimizer_sharded_state_dict` builds the same state dict
  (keys ``optimizer.state.<exp_avg|exp_avg_sq|fp32_param>.<model key>``, ``common_step``, ``param_groups``) with
  megatron-core's helpers, matching by the DTensor's own local tensor.
* **Load.** The loaded values are the local shards (plain tensors); megatron-core's modules and optimizers hold
  DTensors. :func:`as_live_dtensors` wraps every loaded shard as a DTensor of its live counterpart's layout, so
  ``load_state_dict`` of the model and of megatron-core's optimizer run as with DDP (Megatron-LM instead relies on
  the in-place read and skips them, ``skip_load_to_model_and_opt``, which leaves Adam's step and the parameter groups
  unrestored).
"""

from collections.abc import Iterable, Mapping
from itertools import chain
from typing import Any

import torch

from megatron_bridge.errors import CheckpointError


def _dtensor_type() -> type:
    from torch.distributed.tensor import DTensor

    return DTensor


def is_fsdp2_chunk(chunk: torch.nn.Module) -> bool:
    """True when ``chunk``'s parameters are sharded by megatron-core's ``TorchFullyShardedDataParallel``."""
    dtensor = _dtensor_type()
    return any(isinstance(p, dtensor) and getattr(p, "is_torch_fsdp2_param", False) for p in chunk.parameters())


def check_even_shards(chunks: list[torch.nn.Module]) -> None:
    """megatron-core addresses an FSDP2 shard as ``rank × local size`` along dim 0, which is only right when dim 0
    splits evenly over the data-parallel ranks (FSDP2 pads the last shard otherwise).

    Raises:
        CheckpointError: naming the parameters whose dim 0 does not split evenly.
    """
    dtensor = _dtensor_type()
    uneven = []
    for chunk in chunks:
        for name, p in chunk.named_parameters():
            if not isinstance(p, dtensor):
                continue
            ranks = p.device_mesh.size()
            if p.dim() and p.shape[0] >= ranks and p.shape[0] % ranks:
                uneven.append(f"{name} {list(p.shape)}")
    if uneven:
        raise CheckpointError(
            f"dist.use_torch_fsdp2=True on model.engine='megatron_core': megatron-core's torch_dist checkpoint of "
            f"FSDP2 shards needs every parameter's first dimension to split evenly over the data-parallel ranks; "
            f"these do not: {uneven[:6]}. Fix: pick model sizes (hidden, FFN, heads × head dim, padded vocabulary "
            "via model.make_vocab_size_divisible_by) divisible by the data-parallel size, or use megatron-core DDP "
            "(dist.use_torch_fsdp2=False)")


# ------------------------------------------------------------------------------------------------------- save
def _param_index_to_sharded(model_state: dict[str, Any], params: Iterable[torch.Tensor]) -> dict[int, Any]:
    """Optimizer parameter index → the model's ``ShardedTensor`` (or factory) whose data is that parameter's local
    shard (megatron-core's ``get_param_id_to_sharded_param_map``, matching by the DTensor's own local tensor)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.utils import extract_sharded_tensors_and_factories

    dtensor = _dtensor_type()
    sharded, _ = extract_sharded_tensors_and_factories(model_state)
    by_data = {id(t.data): t for t in nested_values(sharded)}
    out: dict[int, Any] = {}
    seen: set[int] = set()
    for index, param in enumerate(params):
        local = param._local_tensor if isinstance(param, dtensor) else param
        if id(local) in seen:
            continue
        seen.add(id(local))
        if id(local) in by_data:
            out[index] = by_data[id(local)]
    return out


def _inner_sharded_state_dict(opt: Any, model_state: dict[str, Any], is_loading: bool) -> dict[str, Any]:
    """megatron-core's ``FP32Optimizer`` / ``Float16OptimizerWithFloat16Params.sharded_state_dict``, FSDP2-aware."""
    from megatron.core.dist_checkpointing.optimizer import make_sharded_optimizer_tensor, optim_state_to_sharding_state
    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params, FP32Optimizer

    if is_loading:
        opt.init_state_fn(opt.optimizer, opt.config)
    if isinstance(opt, Float16OptimizerWithFloat16Params):
        state = opt.state_dict()
        torch_state = state["optimizer"]
        index_map = _param_index_to_sharded(model_state, chain.from_iterable(opt.float16_groups))
        state["fp32_from_fp16_params"] = [
            [make_sharded_optimizer_tensor(index_map[i], main, prefix="optimizer.state.fp32_param")
             for i, main in zip(group["params"], mains, strict=True)]
            for mains, group in zip(state["fp32_from_fp16_params"], torch_state["param_groups"], strict=True)]
    elif isinstance(opt, FP32Optimizer):
        state = torch_state = opt.state_dict()
        index_map = _param_index_to_sharded(model_state, opt.get_parameters())
    else:
        raise CheckpointError(f"checkpoints of dist.use_torch_fsdp2=True on model.engine='megatron_core' support "
                              f"megatron-core's FP32Optimizer and Float16OptimizerWithFloat16Params, not "
                              f"{type(opt).__name__}")
    missing = [i for i in torch_state["state"] if i not in index_map]
    if missing:
        raise CheckpointError(f"{len(missing)} optimizer parameter(s) match no model parameter of the FSDP2 "
                              "chunks' sharded_state_dict (were the chunks wrapped after the optimizer was built?)")
    step = opt._extract_common_per_param_step(torch_state)
    optim_state_to_sharding_state(torch_state, index_map, exclude_keys="step")
    if step:
        torch_state["state"]["common_step"] = step
    return state


def optimizer_sharded_state_dict(optimizer: Any, model_state: dict[str, Any], metadata: dict[str, Any], *,
                                 is_loading: bool) -> Any:
    """megatron-core's ``optimizer.sharded_state_dict(model_state, is_loading, metadata=...)`` for FSDP2 chunks
    (module docstring); a ``ChainedOptimizer`` of several optimizers keys them ``0, 1, ...`` with megatron-core's
    ``chained_<i>.`` prefix rule."""
    from megatron.core.dist_checkpointing.utils import add_prefix_for_sharding

    optimizers = getattr(optimizer, "chained_optimizers", [optimizer])
    if len(optimizers) == 1:
        return _inner_sharded_state_dict(optimizers[0], model_state, is_loading)
    optimizer._synchronize_steps()
    prefix = not metadata.get("chained_optim_avoid_prefix", False)  # no distributed optimizer under FSDP2
    out = {}
    for index, opt in enumerate(optimizers):
        state = _inner_sharded_state_dict(opt, model_state, is_loading)
        if prefix:
            add_prefix_for_sharding(state, f"chained_{index}.")
        out[index] = state
    return out


# ------------------------------------------------------------------------------------------------------- load
def as_live_dtensors(loaded: Any, live: Any) -> Any:
    """``loaded`` (the local shards megatron-core's loader returns) with every plain tensor whose live counterpart
    in ``live`` (a model or optimizer ``state_dict()``, same nesting) is a DTensor wrapped as a DTensor of that
    layout; everything else as it is."""
    dtensor = _dtensor_type()
    if isinstance(live, dtensor) and isinstance(loaded, torch.Tensor) and not isinstance(loaded, dtensor):
        if tuple(loaded.shape) != tuple(live._local_tensor.shape):
            raise CheckpointError(f"a loaded FSDP2 shard has shape {list(loaded.shape)}, the live one "
                                  f"{list(live._local_tensor.shape)}")
        return dtensor.from_local(loaded, live.device_mesh, live.placements, run_check=False, shape=live.shape,
                                  stride=live.stride())
    if isinstance(loaded, Mapping) and isinstance(live, Mapping):
        return {k: as_live_dtensors(v, live[k]) if k in live else v for k, v in loaded.items()}
    if isinstance(loaded, Mapping) and isinstance(live, list | tuple):  # ChainedOptimizer: {0: .., 1: ..} vs list
        return {k: as_live_dtensors(v, live[k]) if isinstance(k, int) and k < len(live) else v
                for k, v in loaded.items()}
    if isinstance(loaded, list | tuple) and isinstance(live, list | tuple) and len(loaded) == len(live):
        return type(loaded)(as_live_dtensors(a, b) for a, b in zip(loaded, live, strict=True))
    return loaded
