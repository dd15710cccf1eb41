"""The PyTorch FSDP2 backend (``dist.use_torch_fsdp2``): ``fully_shard`` per decoder block, then the root.

Options of ``cfg.fsdp2`` and where they go (unit layout and frozen policies: :mod:`.fsdp2_sharding`):

* ``mp_policy`` → ``MixedPrecisionPolicy`` of every unit. When it is None the policy follows the mixed-precision
  preset: ``optimizer.bf16`` → param bfloat16, reduce float32, output bfloat16 (the documented default);
  ``optimizer.fp16`` → the same with float16; neither (the fp32 preset, or no preset) → a full-fp32 policy
  (param, reduce and output float32), which is logged.
* ``offload_policy`` → ``CPUOffloadPolicy(pin_memory=...)``; ``pin_memory=True`` needs an accelerator.
* ``reshard_after_forward`` (None: all blocks but the last reshard; the root never does), ``enable_fsdp2_prefetch``
  with ``fsdp2_forward_prefetch_depth`` / ``fsdp2_backward_prefetch_depth`` → explicit prefetch chains between
  blocks (only when ``reshard_after_forward`` is not False).
* ``defer_fsdp_grad_sync`` → ``grad_sync_context`` calls ``set_requires_gradient_sync(is_last_microbatch)`` on each
  root (recursively); when False every micro-batch reduce-scatters.
* ``activation_checkpointing`` / ``activation_checkpointing_scope`` / ``mlp_activation_checkpointing`` (or
  ``model.recompute_*``) → :mod:`.activation_checkpointing`, before sharding.
* ``autocast_dtype`` → ``torch.autocast`` around each forward (no preset fallback: ``mp_policy`` does that here).
* ``enable_compile`` → per-block ``nn.Module.compile()`` (after activation checkpointing, before sharding).
* ``frozen_module_policy``, ``patch_is_packed_sequence`` → :mod:`.fsdp2_sharding`.
* ``ddp.check_for_nan_in_grad`` → ``clip_grad_norm`` raises TrainingError on a NaN/Inf global norm.

Meta-device models (``model.init_model_with_meta_device``) are sharded first, then ``to_empty`` + ``init_weights``
allocate and initialize only each rank's shard (:mod:`.meta_init`); the full parameters equal a direct build with
the same seed.

Expert parallelism (``model.expert_model_parallel_size > 1``): :mod:`.expert_parallel` keeps this rank's experts
(materializing a meta-device model whole first). With an expert-data-parallel size > 1 each MoE layer's experts
module is its own FSDP2 unit on the 1-D ``"edp"`` mesh (:func:`.fsdp2_sharding.shard_experts`): parameters,
gradients and optimizer state sharded over the ranks holding the same experts, gradients summed over ``"edp"`` and
divided by dp × cp as :meth:`~.expert_parallel.ExpertParallel.reduce_grads` does. With edp size 1 the expert weights
are FSDP2 ``ignored_params``, whole on their EP rank, reduced by the expert-parallel layer. With TP > 1 EP is
folded over the TP ranks (MoE parallel folding): :func:`~.expert_parallel.apply_expert_parallel` gets the TP mesh
and runs before tensor parallelism, whose MoE plan then leaves each TP rank its own tokens.

Tensor parallelism (``model.tensor_model_parallel_size > 1``): the mesh is 2-D ``("dp", "tp")``;
:mod:`.tensor_parallel` applies ``fsdp2.tp_plan`` (or the auto Llama plan, with ``model.sequence_parallel``) and
``fsdp2.enable_async_tensor_parallel`` over ``"tp"`` first, then FSDP2 shards the resulting DTensors over ``"dp"``
(also when ``"dp"`` has one rank, so the mixed-precision policy is installed). Without TP, ``fsdp2.tp_plan`` is
ignored with a warning.

Context parallelism (``model.context_parallel_size > 1``): the mesh is ``("dp", "cp"[, "tp"])``; the attention
modules get the CP attention (:mod:`.context_parallel`) and FSDP2 shards over the flattened ``"dp_cp"`` dimension, so
gradients are reduced over data-parallel × context-parallel ranks.

Pipeline parallelism (``model.pipeline_model_parallel_size > 1``): each stage module is sharded over ``"dp"`` of the
``("pp", "dp", "tp")`` mesh; ``reshard_after_forward=None`` becomes False for every block (logged; an explicit True is
refused under the zero-bubble schedules by validation), and the pipeline stage drives the gradient reduce-scatter.
"""

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

from megatron_bridge.config.rule_set import enforce
from megatron_bridge.distributed.activation_checkpointing import ac_settings, apply_ac_settings
from megatron_bridge.distributed.base import DataParallelBackend
from megatron_bridge.distributed.common import (
    autocast_context,
    check_grad_norm_finite,
    has_meta_params,
    resolve_autocast_dtype,
    to_torch_dtype,
)
from megatron_bridge.distributed.context_parallel import apply_context_parallel
from megatron_bridge.distributed.expert_parallel import apply_expert_parallel
from megatron_bridge.distributed.fsdp2_sharding import (
    ShardedModel,
    ShardingPlan,
    compile_blocks,
    maybe_patch_is_packed_sequence,
    set_prefetch_chains,
    shard_model,
)
from megatron_bridge.distributed.init import (
    build_device_mesh,
    context_parallel_mesh,
    initialize_distributed,
    pipeline_mesh,
    split_mesh,
)
from megatron_bridge.distributed.meta_init import materialize_sharded
from megatron_bridge.distributed.tensor_parallel import apply_tensor_parallel
from megatron_bridge.utils.logging import get_logger, log_rank_0, warn_once


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

logger = get_logger(__name__)


def build_mp_policy(cfg: "ConfigContainer") -> MixedPrecisionPolicy:
    """``fsdp2.mp_policy`` as a torch MixedPrecisionPolicy, or the preset-derived default (module docstring)."""
    policy = cfg.fsdp2.mp_policy
    if isinstance(policy, MixedPrecisionPolicy):
        return policy
    if policy is not None:
        return MixedPrecisionPolicy(
            param_dtype=to_torch_dtype(policy.param_dtype),
            reduce_dtype=to_torch_dtype(policy.reduce_dtype),
            output_dtype=to_torch_dtype(policy.output_dtype),
            cast_forward_inputs=policy.cast_forward_inputs,
        )
    if cfg.optimizer.bf16 or cfg.optimizer.fp16:
        compute = torch.bfloat16 if cfg.optimizer.bf16 else torch.float16
        return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32, output_dtype=compute)
    log_rank_0(logger, "FSDP2: fsdp2.mp_policy=None and no bf16/fp16 preset: full-fp32 MixedPrecisionPolicy "
               "(param, reduce and output float32)")
    return MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, output_dtype=torch.float32)


def build_offload_policy(cfg: "ConfigContainer") -> OffloadPolicy:
    """``fsdp2.offload_policy`` as a CPUOffloadPolicy (None: no offloading).

    Raises:
        ConfigValidationError: ``pin_memory=True`` on a machine without an accelerator (rule
            ``fsdp2_pin_memory_needs_accelerator``).
    """
    policy = cfg.fsdp2.offload_policy
    if policy is None:
        return OffloadPolicy()
    enforce(cfg, "fsdp2_pin_memory_needs_accelerator")
    pin = getattr(policy, "pin_memory", False)
    return policy if isinstance(policy, OffloadPolicy) else CPUOffloadPolicy(pin_memory=pin)


class FSDP2Backend(DataParallelBackend):
    """PyTorch FSDP2 (``fully_shard``) on the data-parallel device mesh, configured by ``cfg.fsdp2``."""

    name = "fsdp2"

    def __init__(self, cfg: "ConfigContainer", device: torch.device) -> None:
        super().__init__(cfg, device)
        self.autocast_dtype = resolve_autocast_dtype("fsdp2.autocast_dtype", cfg.fsdp2.autocast_dtype, cfg,
                                                     use_preset=False)
        self.mp_policy = build_mp_policy(cfg)
        self.offload_policy = build_offload_policy(cfg)
        self.mesh: DeviceMesh | None = None
        """The mesh FSDP2 shards over: ``"dp"``, or the flattened ``"dp_cp"`` with context parallelism."""
        self.cp_mesh: DeviceMesh | None = None
        """The context-parallel mesh (None without CP)."""
        self.tp_mesh: DeviceMesh | None = None
        """The tensor-parallel mesh (None without TP)."""
        self.sharded: list[ShardedModel] = []

    def _plan(self, mesh: DeviceMesh) -> ShardingPlan:
        f = self.cfg.fsdp2
        return ShardingPlan(mesh, self.mp_policy, self.offload_policy, self.reshard_after_forward(),
                            f.frozen_module_policy)

    def reshard_after_forward(self) -> bool | None:
        """``fsdp2.reshard_after_forward``; under pipeline parallelism None means False (logged): a stage's
        parameters are used again by its backward (and by the weight pass of the zero-bubble schedules) after other
        micro-batches' forwards, so resharding would all-gather them again — and is silently wrong under the
        zero-bubble schedules (an explicit True there is a validation error)."""
        value = self.cfg.fsdp2.reshard_after_forward
        if self.pipelined and value is None:
            log_rank_0(logger, "FSDP2 under pipeline parallelism: reshard_after_forward=False for every block "
                       "(fsdp2.reshard_after_forward=None)")
            return False
        return value

    def wrap(self, model_chunks: list[nn.Module]) -> list[nn.Module]:
        """Tensor-parallelize (TP > 1), checkpoint, compile and shard each chunk; materialize meta chunks shard by
        shard."""
        if self.cfg.fsdp2.tp_plan is not None and self.cfg.model.tensor_model_parallel_size <= 1:
            warn_once(logger, "fsdp2_tp_plan_unused", "fsdp2.tp_plan is ignored: it applies only with "
                      "model.tensor_model_parallel_size > 1")
        env = initialize_distributed(self.cfg)
        mesh = build_device_mesh(self.cfg, env)
        self.mesh, self.tp_mesh = split_mesh(mesh)
        self.cp_mesh = context_parallel_mesh(mesh)
        pp_mesh = pipeline_mesh(mesh)
        self.pp_group = pp_mesh.get_group() if pp_mesh is not None else None
        self.expert_parallel = apply_expert_parallel(model_chunks, self.cfg, env, self.device, self.tp_mesh)
        plan = self._plan(self.mesh)
        experts = self.expert_parallel
        if experts is not None and experts.mesh["edp"].size() > 1:
            plan.expert_mesh, plan.expert_divide_factor = experts.mesh["edp"], float(experts.dp_size)
        elif experts is not None:
            plan.ignored_params = set(experts.all_params())
        self.sharded = [self._wrap_chunk(chunk, plan) for chunk in model_chunks]
        if plan.expert_mesh is not None and experts is not None:
            experts.edp_sharded = True
            experts.refresh_params()  # fully_shard replaced them with DTensor parameters
        self.chunks = list(model_chunks)
        self.tie_embeddings()
        return self.chunks

    def _wrap_chunk(self, chunk: nn.Module, plan: ShardingPlan) -> ShardedModel:
        f = self.cfg.fsdp2
        on_meta = has_meta_params([chunk])
        if not on_meta:
            chunk.to(self.device)
        maybe_patch_is_packed_sequence(chunk, f.patch_is_packed_sequence)
        if self.tp_mesh is not None:
            apply_tensor_parallel(chunk, self.tp_mesh, self.cfg)
        if self.cp_mesh is not None:
            enforce(self.cfg, "cp_ring_needs_cuda")
            apply_context_parallel(chunk, self.cp_mesh, self.cfg)
        apply_ac_settings(chunk, ac_settings(self.cfg, "fsdp2"))
        if f.enable_compile:
            compile_blocks(chunk)
        sharded = shard_model(chunk, plan)
        if f.enable_fsdp2_prefetch and plan.reshard_after_forward is not False:
            set_prefetch_chains(sharded.blocks, f.fsdp2_forward_prefetch_depth, f.fsdp2_backward_prefetch_depth)
        if on_meta:
            materialize_sharded(chunk, self.device)
        return sharded

    def forward_context(self) -> AbstractContextManager:
        """``torch.autocast`` when ``fsdp2.autocast_dtype`` is set."""
        return autocast_context(self.device, self.autocast_dtype)

    def grad_sync_context(self, *, is_last_microbatch: bool) -> AbstractContextManager:
        """With ``fsdp2.defer_fsdp_grad_sync``: reduce-scatter only on the last micro-batch; else always. Pipeline
        stages drive the sync themselves (reduce-scatter after the step's last backward)."""
        if self.pipelined:
            return nullcontext()
        sync = is_last_microbatch or not self.cfg.fsdp2.defer_fsdp_grad_sync
        return _requires_gradient_sync([s.root for s in self.sharded], sync)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Global norm of the sharded (DTensor) gradients; NaN/Inf raise with ``ddp.check_for_nan_in_grad``."""
        norm = super().clip_grad_norm(max_norm)
        check_grad_norm_finite(norm, self.cfg)
        return norm


@contextmanager
def _requires_gradient_sync(roots: list, sync: bool) -> Iterator[None]:
    for root in roots:
        root.set_requires_gradient_sync(sync, recurse=True)
    yield
