"""megatron-core's preprocessing of an ``fsdp_dtensor`` state dict (Megatron-Bridge's
``preprocess_fsdp_dtensor_state_dict``), run before writing and before reading (:mod:`.mcore_megatron_fsdp`): the
SwiGLU ``linear_fc1`` split into ``weight_w`` / ``weight_v`` (model and Adam moments), expert re-indexing, and
megatron-fsdp's uneven-DTensor chunk metadata — plus what megatron-core 0.19's version gets wrong on some layouts:

* torch's Adam keeps no state for a parameter whose shard on a rank is empty, so the ranks ran different
  collectives (a hang): :func:`complete_optimizer_state` gives every parameter an entry;
* the SwiGLU split cuts by ``megatron_fsdp_slice``, which megatron-fsdp takes from the model-weight buffer (sharded
  like the optimizer state only with optim_grads_params): :func:`_main_weight_slices` points it at the buffer the
  data lives in;
* with bf16/fp16 the split looked parameters up through ``Float16Module`` by names that skip it:
  :class:`_ParameterView`;
* ``no_shard``: megatron-fsdp sets no ``megatron_fsdp_slice`` at all (there is no model-weight buffer; fp32 has no
  buffer whatever), and megatron-core's ``split_swiglu_linear_fc1`` builds every half with ``make_fsdp_dtensor``'s
  default ``is_sharded_param=True`` — a ``Shard(0)`` over the data-parallel mesh of a tensor every rank holds whole
  (measured: ``AttributeError: 'DTensor' object has no attribute 'megatron_fsdp_slice'``; with a slice, invalid
  chunk metadata). :func:`_split_swiglu_replicated` splits the replicated tensors into replicated halves of the
  same global shapes, so a no_shard checkpoint holds the same keys and shapes as a sharded one.
"""

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F


def complete_optimizer_state(optimizer: Any, state: dict[str, Any]) -> None:
    """Give every parameter an entry in ``state["state"]``: torch's Adam has no state for a parameter whose shard
    on this rank is empty (megatron-fsdp shards its buffers unevenly; small models leave some ranks without a piece
    of a tensor), and megatron-core's preprocessing then runs different collectives on different ranks (a hang);
    the entries are put in the parameters' order, the same on every rank.
    The entry holds empty DTensor moments (nothing to save or load) and the ``step`` of the rank's other
    parameters (every parameter steps together)."""
    entries = state.get("state")
    if not isinstance(entries, dict):
        return
    template = next((v for v in entries.values() if isinstance(v, dict) and "step" in v), None)
    moments = [k for k, v in (template or {}).items() if k != "step" and isinstance(v, torch.Tensor)]
    ordered: dict[str, Any] = {}
    for optimizer_ in getattr(optimizer, "chained_optimizers", [optimizer]):
        for group in optimizer_.optimizer.param_groups:
            for param in group["params"]:
                name = optimizer_._param_name(param)
                if name in entries:
                    ordered[name] = entries.pop(name)
                    continue
                step = template["step"].clone() if template is not None else torch.tensor(0.0)
                ordered[name] = {"step": step, **{k: _empty_like_shard(param) for k in moments or
                                                  ("exp_avg", "exp_avg_sq")}}
    state["state"] = {**ordered, **entries}  # parameter order on every rank: the preprocessing's collectives match


def _empty_like_shard(param: Any) -> Any:
    """A DTensor of ``param``'s global shape and placements with this rank's (empty) local shard: ``zeros_like``
    of a DTensor would give every rank an even shard instead."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return torch.zeros_like(param)
    return DTensor.from_local(torch.zeros_like(param.to_local()), param.device_mesh, param.placements,
                              run_check=False, shape=param.shape, stride=param.stride())


@contextmanager
def _main_weight_slices(module: torch.nn.Module) -> Iterator[None]:
    """Point each distributed parameter's ``megatron_fsdp_slice`` (which part of the tensor this rank holds; what
    megatron-core's SwiGLU split cuts by) at the buffer its data lives in — the main-weight buffer when there is
    one, else the model-weight buffer (its optimizer shard even when the buffer itself is not sharded) — for the
    block.

    megatron-fsdp sets it from the model-weight buffer's own shard, which only optim_grads_params cuts like the
    optimizer state: with optim / optim_grads (unsharded model weights) every rank would claim the whole tensor and
    megatron-core 0.19 fails "DTensor chunk metadata is invalid". (no_shard: :func:`_split_swiglu_replicated`.)"""
    buffer = module.param_and_grad_buffer
    dist_params = dict(buffer.optimizer_named_parameters)
    saved: list[tuple[Any, Any]] = []
    for group in buffer.parameter_groups:
        source = group.main_weight_buffer or group.model_weight_buffer
        for item_id, param in enumerate(group.params):
            dist_param = dist_params.get(buffer.param_to_name[param])
            if dist_param is None:
                continue
            saved.append((dist_param, getattr(dist_param, "megatron_fsdp_slice", None)))
            if source is not None:  # the optimizer's shard of the item (also of an unsharded buffer)
                dist_param.megatron_fsdp_slice = slice(*source._get_item_slice_in_shard(item_id))
    try:
        yield
    finally:
        for dist_param, previous in saved:
            if previous is None:
                del dist_param.megatron_fsdp_slice
            else:
                dist_param.megatron_fsdp_slice = previous


class _ParameterView(torch.nn.Module):
    """What megatron-core's SwiGLU split reads of the model: the ``GPTModel`` (config, ``TransformerLayer``s) and
    ``get_parameter`` by a name with any number of wrapper prefixes (``module.``).

    The handler looks model keys up as ``module.<key>`` and optimizer keys as the optimizer's parameter name less
    one ``module.``; both resolve on ``MegatronFSDP`` in fp32, but with bf16/fp16 ``Float16Module`` sits between
    (``MegatronFSDP.module.module``) while the state dict's names skip it, and the lookup failed ("Float16Module has
    no attribute `decoder`"). The parameters are the model's own (its DTensor shards while the state dict is
    built)."""

    def __init__(self, fsdp_module: torch.nn.Module) -> None:
        from megatron_bridge.engines.megatron_core.precision import unwrap_float16

        super().__init__()
        self.module = unwrap_float16(fsdp_module.module)

    def get_parameter(self, target: str) -> torch.nn.Parameter:
        while target.startswith("module."):
            target = target[len("module."):]
        return self.module.get_parameter(target)


_SWIGLU_FC1 = re.compile(r"\.mlp\.linear_fc1\.(weight|bias)$")
"""The dense SwiGLU ``linear_fc1`` keys megatron-core splits (the megatron-core engine's MoE is refused with Megatron
FSDP: rule moe_backend)."""


def _replicated_halves(data: Any, param: Any) -> tuple[Any, Any]:
    """``data`` (a DTensor replicated over data parallelism, this rank's TP part whole) split along dim 0 into the
    gate and up halves, as DTensors of megatron-fsdp's unsharded shapes (views of ``data``'s local tensor, so a
    load writes into it). Under TP each rank's part is ``[gate_r; up_r]``, so the halves are TP shards of the
    global gate and up weights, as megatron-core builds them."""
    from megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer import make_fsdp_dtensor
    from megatron.core.tensor_parallel.layers import copy_tensor_model_parallel_attributes

    halves = []
    for half in torch.chunk(data.to_local(), 2, dim=0):
        meta = torch.empty(half.shape, device="meta")
        copy_tensor_model_parallel_attributes(meta, param)
        halves.append(make_fsdp_dtensor(half, meta, dist_index=param.megatron_fsdp_dist_index,
                                        is_sharded_param=False))
    return halves[0], halves[1]


def _split_swiglu_replicated(view: _ParameterView, model_state: dict[str, Any],
                             optimizer_state: dict[str, Any] | None) -> tuple[dict[str, Any], Any]:
    """no_shard's SwiGLU split (module docstring): ``<key>_w`` / ``<key>_v`` for each ``linear_fc1`` of the model
    and of the Adam moments, under megatron-core's names."""
    model_state = dict(model_state)
    for key in [k for k in model_state if _SWIGLU_FC1.search(k)]:
        model_state[f"{key}_w"], model_state[f"{key}_v"] = _replicated_halves(model_state.pop(key),
                                                                              view.get_parameter(key))
    if not optimizer_state or not optimizer_state.get("state"):
        return model_state, optimizer_state
    entries: dict[str, Any] = {}
    for key, entry in optimizer_state["state"].items():
        if not _SWIGLU_FC1.search(key):
            entries[key] = entry
            continue
        gate, up = dict(entry), dict(entry)
        for moment in ("exp_avg", "exp_avg_sq"):
            gate[moment], up[moment] = _replicated_halves(entry[moment], view.get_parameter(key))
        entries[f"{key}_w"], entries[f"{key}_v"] = gate, up
    return model_state, {**optimizer_state, "state": entries}


def preprocess(state: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """megatron-core's fsdp_dtensor preprocessing of ``state`` for ``model`` (megatron-fsdp's ``MegatronFSDP``), in
    Megatron-Bridge's order (SwiGLU split, experts, uneven DTensor chunk metadata); returns a new top-level dict
    (nested tensors may be views of the model's)."""
    from megatron.core.distributed.fsdp.src.megatron_fsdp.uneven_dtensor import (
        preprocess_state_dict_for_uneven_dtensor,
    )
    from megatron.core.transformer.fsdp_dtensor_checkpoint import (
        handle_experts_in_state_dict,
        handle_swiglu_in_state_dict,
    )
    from megatron.core.utils import get_model_config

    out = dict(state)
    config = get_model_config(model)
    if getattr(config, "gated_linear_unit", False) and getattr(config, "activation_func", None) is F.silu:
        view = _ParameterView(model)
        if model.ddp_config.data_parallel_sharding_strategy == "no_shard":
            out["model"], optim = _split_swiglu_replicated(view, out["model"], out.get("optimizer"))
        else:
            with _main_weight_slices(model):
                out["model"], optim = handle_swiglu_in_state_dict(view, out["model"], out.get("optimizer"))
        if "optimizer" in out:
            out["optimizer"] = optim
    if getattr(config, "num_moe_experts", None):
        out["model"] = handle_experts_in_state_dict(out["model"], config.num_moe_experts)
    preprocess_state_dict_for_uneven_dtensor(out)
    return out
