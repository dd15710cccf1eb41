"""How FSDP2 cuts a model into units: decoder blocks, frozen modules, the root, prefetch chains, per-block compile.

Units (AutoModel's ``apply_fsdp2_sharding_recursively`` rule): every decoder block — an entry of a ModuleList
whose class name is in the model's ``_no_split_modules`` — gets its own ``fully_shard``; everything else
(embeddings, final norm, output layer) lands in the root unit, which never reshards after forward.

``reshard_after_forward``: None is the heuristic "every block except the last reshards" (the last block's
parameters are needed again at once by backward); True/False force it for every block.

Fully frozen modules outside the blocks (e.g. a frozen embedding), per ``fsdp2.frozen_module_policy``:
``"root"`` leaves their parameters in the root unit, ``"per_layer"`` gives each its own unit (every rank must run it
identically), ``"replicate"`` passes their parameters as ``ignored_params`` to the root, so each rank keeps a full,
unsharded copy outside FSDP.

Routed experts under expert parallelism with an expert-data-parallel size > 1 (``ShardingPlan.expert_mesh``): each
MoE layer's ``experts`` module gets its own ``fully_shard`` on the 1-D ``"edp"`` mesh before its block (whose unit
then skips those parameters), with the block's ``reshard_after_forward``. The reduce-scatter sums over ``"edp"``
and divides by ``ShardingPlan.expert_divide_factor`` (data-parallel × CP size; sum-only collectives, then one
division), which equals :meth:`~.expert_parallel.ExpertParallel.reduce_grads`.
"""

from dataclasses import dataclass, field
from typing import Literal

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from megatron_bridge.distributed.common import BlockRef, find_decoder_blocks
from megatron_bridge.utils.logging import get_logger, log_rank_0, warn_once


logger = get_logger(__name__)

FrozenPolicy = Literal["root", "per_layer", "replicate"]


@dataclass
class ShardingPlan:
    """What one ``fully_shard`` pass needs, from ``cfg.fsdp2``."""

    mesh: DeviceMesh
    mp_policy: MixedPrecisionPolicy
    offload_policy: OffloadPolicy
    reshard_after_forward: bool | None = None
    frozen_module_policy: FrozenPolicy = "root"
    ignored_params: set[nn.Parameter] = field(default_factory=set)
    """Parameters FSDP2 leaves alone (expert-parallel expert weights at edp size 1: reduced by the expert-parallel
    layer)."""
    expert_mesh: DeviceMesh | None = None
    """The 1-D ``"edp"`` mesh the MoE layers' experts are sharded over (None: experts are not sharded here)."""
    expert_divide_factor: float = 1.0
    """The experts' gradient divide factor (their reduce-scatter sums over ``"edp"``, then divides by this)."""


@dataclass
class ShardedModel:
    """The FSDP units of one sharded chunk."""

    root: FSDPModule
    blocks: list[FSDPModule] = field(default_factory=list)
    frozen: list[nn.Module] = field(default_factory=list)
    """Fully frozen modules the frozen policy applied to."""


def block_reshard(explicit: bool | None, index: int, num_blocks: int) -> bool:
    """``reshard_after_forward`` of block ``index``: an explicit True/False wins, else all but the last block."""
    if explicit is not None:
        return explicit
    return index < num_blocks - 1


def find_frozen_modules(model: nn.Module, blocks: list[BlockRef]) -> list[nn.Module]:
    """Topmost fully frozen modules (parameters, none trainable) outside the decoder blocks and their lists."""
    block_ids = {id(ref.module) for ref in blocks}
    found: list[nn.Module] = []
    _collect_frozen(model, block_ids, found)
    return found


def _collect_frozen(module: nn.Module, block_ids: set[int], out: list[nn.Module]) -> None:
    for child in module.children():
        if id(child) in block_ids:
            continue
        params = list(child.parameters(recurse=True))
        container = isinstance(child, (nn.ModuleList, nn.ModuleDict))
        if params and not container and not any(p.requires_grad for p in params):
            out.append(child)
            continue
        _collect_frozen(child, block_ids, out)


def shard_model(model: nn.Module, plan: ShardingPlan) -> ShardedModel:
    """``fully_shard`` the decoder blocks, the frozen modules (per the policy), then the root; see module docstring."""
    blocks = find_decoder_blocks(model)
    frozen = find_frozen_modules(model, blocks)
    common = {"mesh": plan.mesh, "mp_policy": plan.mp_policy, "offload_policy": plan.offload_policy}
    units: list[FSDPModule] = []
    for index, ref in enumerate(blocks):
        reshard = block_reshard(plan.reshard_after_forward, index, len(blocks))
        shard_experts(ref.module, plan, reshard)
        in_block = {p for p in ref.module.parameters() if p in plan.ignored_params}
        units.append(fully_shard(ref.module, reshard_after_forward=reshard, ignored_params=in_block or None,
                                 **common))
    ignored = _apply_frozen_policy(frozen, plan, common) | plan.ignored_params
    shard_experts(model, plan, False)  # MoE layers outside the decoder blocks, if any
    root = fully_shard(model, reshard_after_forward=False, ignored_params=ignored or None, **common)
    log_rank_0(logger, "FSDP2: %d block units (reshard_after_forward=%s), root unit, %d frozen module(s) with "
               "policy %r", len(units), plan.reshard_after_forward, len(frozen), plan.frozen_module_policy)
    return ShardedModel(root, units, frozen)


def shard_experts(module: nn.Module, plan: ShardingPlan, reshard: bool) -> int:
    """``fully_shard`` every not yet sharded MoE ``experts`` module under ``module`` on ``plan.expert_mesh`` (module
    docstring); returns how many."""
    if plan.expert_mesh is None:
        return 0
    from megatron_bridge.models.moe import MoELayer

    count = 0
    for layer in module.modules():
        if isinstance(layer, MoELayer) and not isinstance(layer.experts, FSDPModule):
            unit = fully_shard(layer.experts, mesh=plan.expert_mesh, reshard_after_forward=reshard,
                               mp_policy=plan.mp_policy, offload_policy=plan.offload_policy)
            unit.set_gradient_divide_factor(plan.expert_divide_factor)
            unit.set_force_sum_reduction_for_comms(True)  # sum, then divide (gloo has no PREMUL_SUM)
            count += 1
    return count


def _apply_frozen_policy(frozen: list[nn.Module], plan: ShardingPlan, common: dict) -> set[nn.Parameter]:
    """Shard frozen modules in their own units ("per_layer") or collect their parameters to ignore ("replicate")."""
    if plan.frozen_module_policy == "per_layer":
        if frozen:
            warn_once(logger, "frozen_per_layer", "fsdp2.frozen_module_policy='per_layer': every rank must run the "
                      "frozen modules identically on every micro-batch")
        reshard = True if plan.reshard_after_forward is None else plan.reshard_after_forward
        for module in frozen:
            fully_shard(module, reshard_after_forward=reshard, **common)
        return set()
    if plan.frozen_module_policy == "replicate":
        return {p for module in frozen for p in module.parameters()}
    return set()


def set_prefetch_chains(blocks: list[FSDPModule], forward_depth: int, backward_depth: int) -> None:
    """Explicit prefetch: block i all-gathers blocks i+1..i+forward_depth in forward and i-1..i-backward_depth
    in backward (AutoModel's chains; a depth of 0 leaves FSDP's implicit prefetching)."""
    for i, unit in enumerate(blocks):
        ahead = blocks[i + 1 : i + 1 + forward_depth]
        if forward_depth > 0 and ahead:
            unit.set_modules_to_forward_prefetch(ahead)
        behind = [blocks[j] for j in range(i - 1, max(i - 1 - backward_depth, -1), -1)]
        if backward_depth > 0 and behind:
            unit.set_modules_to_backward_prefetch(behind)


def compile_blocks(model: nn.Module) -> int:
    """``torch.compile`` each decoder block in place (``nn.Module.compile``): no whole-model compile, so state-dict
    keys never get ``_orig_mod.``; a checkpoint wrapper is compiled with its non-reentrant checkpoint inside."""
    blocks = find_decoder_blocks(model)
    for ref in blocks:
        ref.module.compile()
    log_rank_0(logger, "FSDP2: compiled %d decoder blocks (per-block torch.compile)", len(blocks))
    return len(blocks)


def maybe_patch_is_packed_sequence(model: nn.Module, enabled: bool) -> bool:
    """``fsdp2.patch_is_packed_sequence``: for Hugging Face models (class module ``transformers.*``) make
    ``transformers.modeling_flash_attention_utils._is_packed_sequence`` return False (idempotent). A no-op, logged
    once, for other models. Returns True when the patch is in place."""
    if not enabled:
        return False
    if not type(model).__module__.startswith("transformers."):
        warn_once(logger, "patch_is_packed_sequence_noop", "fsdp2.patch_is_packed_sequence=True is a no-op for %s "
                  "(not a Hugging Face transformers model)", type(model).__name__)
        return False
    try:
        import transformers.modeling_flash_attention_utils as fa_utils
    except ImportError:
        warn_once(logger, "patch_is_packed_sequence_import", "fsdp2.patch_is_packed_sequence=True: transformers is "
                  "not importable; nothing patched")
        return False
    if not getattr(fa_utils, "_is_packed_sequence_patched", False):
        if not hasattr(fa_utils, "_is_packed_sequence"):
            warn_once(logger, "patch_is_packed_sequence_missing", "fsdp2.patch_is_packed_sequence=True: this "
                      "transformers version has no _is_packed_sequence; nothing patched")
            return False
        fa_utils._is_packed_sequence = _never_packed
        fa_utils._is_packed_sequence_patched = True
        log_rank_0(logger, "FSDP2: patched transformers _is_packed_sequence to return False")
    return True


def _never_packed(*args: object, **kwargs: object) -> bool:
    return False
