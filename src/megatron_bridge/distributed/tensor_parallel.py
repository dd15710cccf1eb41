"""Tensor parallelism (TP) of the local Llama model with ``torch.distributed.tensor.parallel`` on the ``"tp"`` mesh.

:func:`apply_tensor_parallel` runs before activation checkpointing, compile and FSDP2 (torchtitan's order), so FSDP2
then shards the TP DTensors over the ``"dp"`` dimension of the same 2-D ``("dp", "tp")`` mesh.

Auto-selected plan (``fsdp2.tp_plan=None``, :func:`llama_tp_plan`, keyed by the shared decoder's names from
:mod:`megatron_bridge.config.decoder_names`): the attention's query/key/value and the MLP's gate/up projections
column-wise, the attention's and the MLP's output projections row-wise, the embedding row-wise over the vocabulary
(input replicated), the output layer column-wise with a replicated output (the model computes the loss from full
logits); the norms are replicated over the TP group, the per-head query/key norms see their rank's heads. With
``model.sequence_parallel`` the residual stream is sharded over the sequence (``Shard(1)``): the norms are
``SequenceParallel``, the attention and MLP inputs are gathered by ``PrepareModuleInput`` and the row-wise layers
reduce-scatter (as torchtitan).

Tied embeddings (``model.share_embeddings_and_output_weights``, no output layer): the vocabulary-parallel
embedding's weight is ``Shard(0)`` of ``[vocab, hidden]``, which is exactly the layout a column-wise output layer
needs, so the one DTensor parameter serves both. :func:`apply_tensor_parallel` installs a parameter-free
:class:`TiedOutput` as the output layer that computes the logits from the embedding's weight (looked up at every call,
so FSDP2's unsharded parameter is used) with a replicated input (``Shard(1)`` gathered with sequence parallelism) and
returns replicated local logits. It registers nothing: the state dict keeps the tied model's keys (no output layer's),
and both uses accumulate into the embedding's gradient.

Custom plan (``fsdp2.tp_plan``, :func:`plan_from_patterns`): module-name pattern (``fnmatch`` on the fully qualified
name such as ``"layers.*.<attention>.<query projection>"`` in ``decoder_names``; the first matching pattern wins) →
``"colwise"`` | ``"rowwise"`` | ``"sequence_parallel"`` | ``"replicate"``. Embeddings and the output layer always
produce replicated outputs, and with ``model.sequence_parallel`` column-wise layers gather ``Shard(1)`` inputs and
row-wise layers reduce-scatter to ``Shard(1)``. Modules the plan leaves out that own parameters are replicated over the
TP group (logged), so every parameter lives on the TP mesh: FSDP2, the optimizer and gradient clipping then see one 2-D
mesh.

MoE layers (:func:`moe_tp_plan`, ``expert_tensor_parallel_size=1``): router and routed experts replicated over the TP
group (expert-parallel experts stay plain), the shared expert column/row-wise. With EP = 1 and sequence parallelism
the layer gathers the sequence on entry and keeps its rank's part on exit; with EP > 1 (MoE parallel folding) each
TP rank routes its own tokens, and only the shared expert gathers the sequence.

An attention block with its own split (multi-latent attention, ``models/mla.py``) names its submodules' styles
(``tensor_parallel_styles``) and reads its local head count from its projections' outputs.

Attention modules whose query projection is column-wise get their head counts (``num_heads``, ``num_kv_heads``)
divided by TP, so the model's reshapes use the local heads.
"""

from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn import functional as F

from megatron_bridge.config import decoder_names as n
from megatron_bridge.config.rule_set import enforce
from megatron_bridge.config.tp_plan import check_attention_split, match_patterns
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.models.moe import MoELayer
from megatron_bridge.utils.logging import get_logger, log_rank_0, warn_once


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

logger = get_logger(__name__)

"""Style names accepted in ``fsdp2.tp_plan``."""


class ReplicateParallel(ParallelStyle):
    """Parameters replicated over the TP mesh; tensor inputs enter as replicated DTensors, outputs leave as local
    tensors. For modules computed identically on every TP rank (norms without sequence parallelism)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, None, _replicate_inputs, _local_outputs)


def _replicate_inputs(module: nn.Module, inputs: tuple[Any, ...], mesh: DeviceMesh) -> tuple[Any, ...]:
    return tuple(
        DTensor.from_local(x, mesh, (Replicate(),), run_check=False)
        if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) else x
        for x in inputs
    )


def _local_outputs(module: nn.Module, outputs: Any, mesh: DeviceMesh) -> Any:
    return outputs.to_local() if isinstance(outputs, DTensor) else outputs


class TiedOutput(nn.Module):
    """The output layer of a tied model under TP: logits ``x @ weight.T`` from the embedding's weight (a
    DTensor on the TP mesh, ``Shard(0)`` over the vocabulary with the auto plan), returned as replicated local
    tensors. Holds no parameter and no submodule (the embedding is referenced, not registered), so the state dict and
    the parameter list are those of the tied model; the weight is read at every call (FSDP2 swaps in its unsharded
    parameter during forward).

    Args:
        embedding: the model's embedding.
        input_layout: layout of a local (non-DTensor) input over the TP mesh: ``Replicate()``, or ``Shard(1)`` with
            sequence parallelism. DTensor inputs keep their own layout.
    """

    def __init__(self, embedding: nn.Embedding, input_layout: Placement) -> None:
        super().__init__()
        self._embedding = (embedding,)  # a tuple, not a submodule: the weight stays registered once
        self.input_layout = input_layout

    @property
    def weight(self) -> torch.Tensor:
        """The tied ``[vocab, hidden]`` weight (the embedding's)."""
        return self._embedding[0].weight

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[b, s, hidden]`` → replicated local logits ``[b, s, vocab]``."""
        weight = self.weight
        if not isinstance(weight, DTensor):
            return F.linear(hidden_states, weight)
        mesh = weight.device_mesh
        if not isinstance(hidden_states, DTensor):
            hidden_states = DTensor.from_local(hidden_states, mesh, (self.input_layout,), run_check=False)
        logits = F.linear(hidden_states.redistribute(mesh, (Replicate(),)), weight)
        return logits.redistribute(mesh, (Replicate(),)).to_local()

    def extra_repr(self) -> str:
        return f"tied to {n.EMBEDDING}, input_layout={self.input_layout}"


def install_tied_output(model: nn.Module, *, sequence_parallel: bool) -> bool:
    """Set the model's output layer to a :class:`TiedOutput` when the model ties it to the embedding (the output
    layer is None) and that weight is a DTensor; returns True when installed."""
    embedding = getattr(model, n.EMBEDDING, None)
    if getattr(model, n.OUTPUT, False) is not None or not isinstance(embedding, nn.Embedding):
        return False
    if not getattr(model, "has_output_layer", True):  # a pipeline stage that ends before the output layer
        return False
    if not isinstance(embedding.weight, DTensor):
        return False
    setattr(model, n.OUTPUT, TiedOutput(embedding, Shard(1) if sequence_parallel else Replicate()))
    return True


def head_sharded_norm() -> ParallelStyle:
    """A per-head norm (``decoder_names.HEAD_NORMS`` on ``[b, heads, s, d]``) seeing only its rank's heads: the input
    is the local part of dim 1, the weight is replicated and its gradient summed over the TP group."""
    return SequenceParallel(sequence_dim=1, use_local_output=True)


# ------------------------------------------------------------------------------------------------------ plans
def llama_tp_plan(model: nn.Module, *, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """The auto-selected plan of the shared decoder (module docstring), keyed by fully qualified module name.

    A tied model (no output layer) gets no output-layer entry: :func:`apply_tensor_parallel` installs a
    :class:`TiedOutput` over the vocabulary-parallel embedding weight.

    Raises:
        ConfigValidationError: the model lacks the shared decoder's embedding, final norm or output layer.
    """
    missing = [name for name in (n.EMBEDDING, n.FINAL_NORM, n.OUTPUT) if not hasattr(model, name)]
    if missing:
        raise ConfigValidationError(
            f"the auto-selected TP plan is for Llama-style models, and {type(model).__name__} has no {missing}: set "
            "fsdp2.tp_plan to a custom plan (module-name pattern → colwise/rowwise/sequence_parallel/replicate).",
            ("fsdp2.tp_plan",),
        )
    sp = sequence_parallel
    stream = Shard(1) if sp else Replicate()  # layout of the residual stream between blocks
    plan: dict[str, ParallelStyle] = {}
    # A pipeline stage holds the embedding only on the first stage and the norm/output layer only on the last.
    if getattr(model, n.EMBEDDING) is not None:
        plan[n.EMBEDDING] = RowwiseParallel(input_layouts=Replicate(), output_layouts=stream)
    if getattr(model, n.FINAL_NORM) is not None:
        plan[n.FINAL_NORM] = _norm_style(sp)
    if getattr(model, n.OUTPUT) is not None:
        plan[n.OUTPUT] = ColwiseParallel(input_layouts=stream, output_layouts=Replicate())
    for name, module in model.named_modules():
        if hasattr(module, n.ATTENTION) and hasattr(module, n.MLP):
            plan.update(_layer_plan(name, module, sp))
    return plan


def _norm_style(sp: bool) -> ParallelStyle:
    return SequenceParallel() if sp else ReplicateParallel()


def _layer_plan(name: str, layer: nn.Module, sp: bool) -> dict[str, ParallelStyle]:
    """The auto plan of one decoder layer ``name``: its norms, attention and MLP (dense or MoE)."""
    stream = Shard(1) if sp else Replicate()
    attn, mlp = f"{name}.{n.ATTENTION}", f"{name}.{n.MLP}"
    norms = (n.ATTENTION_NORM, n.MLP_NORM, *(post for post in n.POST_NORMS if getattr(layer, post, None) is not None))
    plan: dict[str, ParallelStyle] = {f"{name}.{norm}": _norm_style(sp) for norm in norms}
    if sp:
        plan[attn] = PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                        desired_input_layouts=(Replicate(), None, None))
        plan[mlp] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    block = getattr(layer, n.ATTENTION)
    if hasattr(block, "tensor_parallel_styles"):  # an attention block with its own split (models/mla.py)
        plan.update({f"{attn}.{sub}": _block_style(style, sp) for sub, style in block.tensor_parallel_styles().items()})
    else:
        plan.update({f"{attn}.{proj}": ColwiseParallel() for proj in n.QKV})
        plan[f"{attn}.{n.O_PROJ}"] = RowwiseParallel(output_layouts=stream)
    for head_norm in n.HEAD_NORMS:
        if getattr(block, head_norm, None) is not None:
            plan[f"{attn}.{head_norm}"] = head_sharded_norm()
    module = getattr(layer, n.MLP)
    if isinstance(module, MoELayer):
        plan.pop(mlp, None)
        plan.update(moe_tp_plan(mlp, module, sequence_parallel=sp))
        return plan
    for proj in (n.GATE, n.UP):
        if getattr(module, proj, None) is not None:
            plan[f"{mlp}.{proj}"] = ColwiseParallel()
    plan[f"{mlp}.{n.DOWN}"] = RowwiseParallel(output_layouts=stream)
    return plan


def _block_style(style: str, sp: bool) -> ParallelStyle:
    """The style an attention block names for a submodule (``tensor_parallel_styles``): column-wise, row-wise into
    the residual stream's layout, or replicated over the TP group."""
    if style == "colwise":
        return ColwiseParallel()
    if style == "rowwise":
        return RowwiseParallel(output_layouts=Shard(1) if sp else Replicate())
    return ReplicateParallel()


class ReplicateParams(ParallelStyle):
    """Parameters become DTensors replicated over the TP mesh; inputs and outputs are left as they are (the module
    reads its weights with ``to_local()``). Parameters already owned by expert parallelism stay plain."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for sub in module.modules():
            for pname, param in list(sub.named_parameters(recurse=False)):
                if isinstance(param, DTensor) or getattr(param, "_expert_parallel", False):
                    continue
                replicated = distribute_tensor(param.data, device_mesh, [Replicate()], src_data_rank=None)
                sub.register_parameter(pname, nn.Parameter(replicated, requires_grad=param.requires_grad))
        return module


def moe_tp_plan(prefix: str, moe: MoELayer, *, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """TP of an MoE layer: the router and the routed experts are replicated over the TP group (experts owned by
    expert parallelism, whole or split over TP with ETP = TP, stay plain tensors), the shared expert is split like a
    dense MLP.

    Without a token split (EP = 1) every TP rank routes the same tokens: with sequence parallelism the layer gathers
    the sequence on entry and keeps its rank's part on exit (its gradients then arrive whole on every TP rank, so the
    replicated weights get identical gradients). With ``moe.tp_tokens`` (EP > 1, MoE parallel folding) the routed
    experts take the rank's own tokens and only the shared expert gathers the sequence (sequence parallelism: on its
    entry, reduce-scattered on its exit)."""
    plan: dict[str, ParallelStyle] = {f"{prefix}.{n.ROUTER}": ReplicateParams(),
                                      f"{prefix}.{n.EXPERTS}": ReplicateParams()}
    split = moe.tp_tokens is not None
    if sequence_parallel and not split:
        plan[prefix] = PrepareModuleInputOutput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_input=True,
            output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),), use_local_output=True,
        )
    elif sequence_parallel:  # the rank's sequence shard, as a local tensor (the norm before hands a DTensor)
        plan[prefix] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),),
                                          use_local_output=True)
    if getattr(moe, n.SHARED_EXPERTS, None) is not None:
        shared = f"{prefix}.{n.SHARED_EXPERTS}"
        own_sp = sequence_parallel and split
        if own_sp:
            plan[shared] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        plan[f"{shared}.{n.GATE}"] = ColwiseParallel()
        plan[f"{shared}.{n.UP}"] = ColwiseParallel()
        plan[f"{shared}.{n.DOWN}"] = RowwiseParallel(output_layouts=Shard(1) if own_sp else Replicate())
    return plan


def validate_tp_plan(patterns: dict[str, str], *, sequence_parallel: bool) -> None:
    """Check the style names of a custom plan (the ``tp_plan_styles`` rule of ``validate()``).

    Raises:
        ConfigValidationError: not a dict, an unknown style, or "sequence_parallel" without
            ``model.sequence_parallel``.
    """
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.config.distributed import FSDP2Config
    from megatron_bridge.config.model import ModelConfig

    cfg = ConfigContainer(fsdp2=FSDP2Config(tp_plan=patterns), model=ModelConfig(sequence_parallel=sequence_parallel))
    enforce(cfg, "field_types", "tp_plan_styles", world_size=1)


def _style_for(module: nn.Module, style: str, model: nn.Module, sp: bool) -> ParallelStyle:
    stream = Shard(1) if sp else Replicate()
    is_output = module is getattr(model, n.OUTPUT, None)
    if style == "colwise":
        if isinstance(module, nn.Embedding):
            return ColwiseParallel(input_layouts=Replicate(), output_layouts=stream)
        return ColwiseParallel(input_layouts=stream, output_layouts=Replicate() if is_output else Shard(-1))
    if style == "rowwise":
        if isinstance(module, nn.Embedding):
            return RowwiseParallel(input_layouts=Replicate(), output_layouts=stream)
        return RowwiseParallel(output_layouts=stream)
    if style == "sequence_parallel":
        return SequenceParallel()
    return ReplicateParallel()


def plan_from_patterns(model: nn.Module, patterns: dict[str, str], *, sequence_parallel: bool,
                       log: bool = True) -> dict[str, Any]:
    """Resolve a custom ``fsdp2.tp_plan`` (module docstring) against ``model``: fully qualified name → style.

    Patterns matching no module are logged once. Modules left out that own parameters are replicated (logged unless
    ``log`` is False).

    Raises:
        ConfigValidationError: a bad entry (see :func:`validate_tp_plan`) or the plan matches no module.
    """
    validate_tp_plan(patterns, sequence_parallel=sequence_parallel)
    matched = match_patterns([name for name, _ in model.named_modules()], patterns, type(model).__name__)
    names = {name: patterns[p] for name, p in matched.items()}
    used = set(matched.values())
    for pattern in patterns.keys() - used if log else ():
        warn_once(logger, f"tp_plan_unused:{pattern}", "fsdp2.tp_plan pattern %r matches no module", pattern)
    modules = dict(model.named_modules())
    plan: dict[str, Any] = {n: _style_for(modules[n], s, model, sequence_parallel) for n, s in names.items()}
    covered = tuple(f"{n}." for n in names)
    for name, module in modules.items():
        parent, _, leaf = name.rpartition(".")
        if leaf in n.HEAD_NORMS and names.get(f"{parent}.{n.Q_PROJ}") == "colwise":
            plan[name] = head_sharded_norm()  # per-head norms follow their attention's head split
        elif name not in names and not name.startswith(covered) and any(True for _ in module.parameters(False)):
            plan[name] = ReplicateParallel()
            if log:
                log_rank_0(logger, "TP: %s is not in fsdp2.tp_plan; its parameters are replicated over the TP group",
                           name or type(model).__name__)
    return plan


# -------------------------------------------------------------------------------------------------- applying
def _style_name(style: object) -> str | None:
    if isinstance(style, ColwiseParallel):
        return "colwise"
    return "rowwise" if isinstance(style, RowwiseParallel) else None


def divide_attention_heads(model: nn.Module, plan: dict[str, Any], tp: int) -> int:
    """Divide ``num_heads``/``num_kv_heads`` by ``tp`` on attention modules whose query projection is column-wise;
    returns how many modules changed.

    Raises:
        ConfigValidationError: the query/key/value projections are not all column-wise with the output projection
            row-wise, or heads do not divide by TP.
    """
    changed = 0
    for name, module in model.named_modules():
        if not (hasattr(module, "num_heads") and hasattr(module, "num_kv_heads")):
            continue
        styles = {p: _style_name(plan.get(f"{name}.{p}")) for p in n.PROJECTIONS}
        heads = {attr: getattr(module, attr) for attr in ("num_heads", "num_kv_heads")}
        if not check_attention_split(name, styles, heads, tp):
            continue
        for attr, value in heads.items():
            setattr(module, attr, value // tp)
        changed += 1
    return changed


def shard_attention_sinks(model: nn.Module, tp_mesh: DeviceMesh) -> int:
    """Split the per-head attention sinks (``model.softmax_type``) of the attention modules whose heads TP divided:
    the ``sinks`` parameter becomes a ``Shard(0)`` DTensor (each rank's heads; the attention reads its local part),
    an off-by-one module's ``zero_sinks`` buffer keeps its rank's heads. Returns how many modules changed."""
    changed = 0
    for module in model.modules():
        sinks = getattr(module, n.SINKS, None)
        buffer = getattr(module, "zero_sinks", None)
        if not hasattr(module, "num_heads") or (sinks is None and buffer is None):
            continue
        if sinks is not None and not isinstance(sinks, DTensor) and sinks.shape[0] != module.num_heads:
            sharded = distribute_tensor(sinks.data, tp_mesh, [Shard(0)], src_data_rank=None)
            module.register_parameter(n.SINKS, nn.Parameter(sharded, requires_grad=sinks.requires_grad))
            changed += 1
        if buffer is not None and buffer.shape[0] != module.num_heads:
            module.register_buffer("zero_sinks", buffer[: module.num_heads].clone(), persistent=False)
            changed += 1
    return changed


def enable_async_tp(tp_mesh: DeviceMesh) -> bool:
    """``fsdp2.enable_async_tensor_parallel``: inductor micro-pipeline TP plus symmetric memory for the TP group.

    CUDA only: on other devices it is a no-op (logged once). Failures are logged as warnings. Returns True when on.
    """
    if tp_mesh.device_type != "cuda":
        warn_once(logger, "async_tp_cpu", "fsdp2.enable_async_tensor_parallel=True is a no-op on %s (async TP needs "
                  "CUDA symmetric memory)", tp_mesh.device_type)
        return False
    try:
        import torch._inductor.config as inductor_config
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        inductor_config._micro_pipeline_tp = True
        enable_symm_mem_for_group(tp_mesh.get_group().group_name)
    except Exception as exc:  # noqa: BLE001 - an optional optimisation: never fatal
        warn_once(logger, "async_tp_failed", "fsdp2.enable_async_tensor_parallel: could not enable async TP (%s: "
                  "%s); training continues with synchronous TP", type(exc).__name__, exc)
        return False
    log_rank_0(logger, "TP: async tensor parallelism on (inductor micro-pipeline TP, symmetric memory)")
    return True


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, cfg: "ConfigContainer") -> dict[str, Any]:
    """Parallelize ``model`` in place over ``tp_mesh`` with ``fsdp2.tp_plan`` or the auto Llama plan; divide the
    attention head counts; for tied embeddings install :class:`TiedOutput` as the output layer; enable async TP when
    asked. Returns the resolved plan (name → style).

    Raises:
        ConfigValidationError: a bad custom plan, or sizes not divisible by TP.
    """
    tp, sp = cfg.model.tensor_model_parallel_size, cfg.model.sequence_parallel
    if tp_mesh.size() != tp:
        raise ConfigValidationError(
            f"the TP mesh has {tp_mesh.size()} ranks but model.tensor_model_parallel_size={tp}.",
            ("model.tensor_model_parallel_size",),
        )
    enforce(cfg, "tensor_parallel_divisible")
    custom = cfg.fsdp2.tp_plan
    if custom is not None:
        plan = plan_from_patterns(model, custom, sequence_parallel=sp)
    else:
        plan = llama_tp_plan(model, sequence_parallel=sp)
    heads = divide_attention_heads(model, plan, tp)
    on_meta = any(p.is_meta for p in model.parameters())
    parallelize_module(model, tp_mesh, plan, src_data_rank=None if on_meta else 0)
    shard_attention_sinks(model, tp_mesh)
    tied = install_tied_output(model, sequence_parallel=sp)
    if cfg.fsdp2.enable_async_tensor_parallel:
        enable_async_tp(tp_mesh)
    log_rank_0(logger, "TP: %s plan over %d ranks (sequence_parallel=%s): %d modules, %d attention modules with "
               "local heads%s", "custom" if custom is not None else "auto Llama", tp, sp, len(plan), heads,
               ", output layer tied to the vocabulary-parallel embedding" if tied else "")
    return plan
