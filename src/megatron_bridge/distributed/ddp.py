"""The torch DistributedDataParallel backend (the default when no FSDP backend is selected).

Options of ``cfg.ddp`` and where they go:

* ``broadcast_buffers`` → DDP's ``forward_sync_buffers`` where the installed torch has it (2.13+, which deprecates
  ``broadcast_buffers``), else ``broadcast_buffers``. With ``forward_sync_buffers`` buffers are still broadcast once
  from rank 0 at construction (harmless: this library's buffers are deterministic RoPE tables), and with False not
  before each forward. ``bucket_cap_mb`` (omitted when None: torch's 25 MiB),
  ``find_unused_parameters``, ``gradient_as_bucket_view``, ``static_graph`` → the DDP constructor.
* ``activation_checkpointing`` / ``activation_checkpointing_scope`` (or ``model.recompute_*``) → decoder blocks are
  wrapped before DDP (:mod:`megatron_bridge.distributed.activation_checkpointing`).
* ``autocast_dtype`` → ``torch.autocast(device_type, dtype)`` around each forward (``forward_context``). When it is
  None and a mixed-precision preset set ``optimizer.bf16`` / ``optimizer.fp16``, the forward autocasts to bfloat16 /
  float16 (the master weights stay in ``model.params_dtype``).
* ``check_for_nan_in_grad`` → ``clip_grad_norm`` raises TrainingError when the global gradient norm is NaN/Inf.
* ``optimizer.use_distributed_optimizer`` (kept equal to ``ddp.use_distributed_optimizer``) → ZeRO-1: the optimizer
  becomes torch's ZeroRedundancyOptimizer (``prepare_optimizer``; :mod:`megatron_bridge.distributed.zero`), each
  rank holding the state of ~1/DP of the parameters; checkpoints keep the replicated format.

Gradient accumulation: ``grad_sync_context(is_last_microbatch=False)`` is DDP's ``no_sync()``. A world of one
process still wraps (gloo), so every code path is the same as in a multi-process run. Models built on the meta
device are materialized (``to_empty`` + ``init_weights``) on the device first, then wrapped.

Tensor parallelism (``model.tensor_model_parallel_size > 1``): the mesh is ``("dp"[, "cp"], "tp")``;
:mod:`.tensor_parallel` applies the same plan as under FSDP2 (``fsdp2.tp_plan`` or the auto plan, with
``model.sequence_parallel``) over ``"tp"``, and each chunk is wrapped with torch's FSDP-based ``replicate`` over
``"dp"`` (``"dp_cp"`` with CP): classic DistributedDataParallel cannot wrap DTensor parameters, ``replicate`` keeps
each parameter whole on its data-parallel ranks (a ``(Replicate, Shard)`` DTensor over ``("dp", "tp")``) and
all-reduces its gradient after the last micro-batch's backward (``set_requires_gradient_sync``). With MoE, expert
parallelism is folded over the TP ranks as under FSDP2 (:func:`~.expert_parallel.apply_expert_parallel` gets the TP
mesh, before TP). ZeRO-1 (``optimizer.use_distributed_optimizer``) keeps the optimizer state replicated here (logged).

Context parallelism (``model.context_parallel_size > 1``): the attention modules get the CP attention
(:mod:`.context_parallel`) and DDP all-reduces over the flattened ``"dp_cp"`` mesh dimension.

Pipeline parallelism (``model.pipeline_model_parallel_size > 1``): each stage module is wrapped over the ``"dp"``
group of the ``("pp", "dp", ...)`` mesh with torch's FSDP-based ``replicate`` (logged), and the pipeline stage
drives the gradient all-reduce after the step's last backward. Classic DistributedDataParallel is measured to break
under pipeline schedules: multi-stage schedules crash in the reducer at the second step (or, with ``static_graph``,
train with silently wrong gradients), and 1F1B at PP=4 fails the reducer's bucket-rebuild assertion at the second
step; ``replicate`` matches a single process on every schedule.

Expert parallelism (``model.expert_model_parallel_size > 1``) keeps the expert weights out of DDP and reduces their
gradients itself (:mod:`megatron_bridge.distributed.expert_parallel`).
"""

import inspect
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from functools import cache
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

from megatron_bridge.config.model import resolve_schedule
from megatron_bridge.config.rule_set import enforce
from megatron_bridge.distributed.activation_checkpointing import ac_settings, apply_ac_settings
from megatron_bridge.distributed.base import DataParallelBackend, _as_module
from megatron_bridge.distributed.common import (
    autocast_context,
    check_grad_norm_finite,
    has_meta_params,
    resolve_autocast_dtype,
)
from megatron_bridge.distributed.context_parallel import apply_context_parallel
from megatron_bridge.distributed.expert_parallel import ExpertParallel, apply_expert_parallel, ignore_in_ddp
from megatron_bridge.distributed.init import (
    build_device_mesh,
    context_parallel_mesh,
    initialize_distributed,
    pipeline_mesh,
    split_mesh,
)
from megatron_bridge.distributed.tensor_parallel import apply_tensor_parallel
from megatron_bridge.models.provider import materialize_meta_model
from megatron_bridge.utils.logging import get_logger, log_rank_0, warn_once


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

logger = get_logger(__name__)


@cache
def _ddp_accepts(name: str) -> bool:
    return name in inspect.signature(DistributedDataParallel.__init__).parameters


def ddp_kwargs(cfg: "ConfigContainer", device: torch.device) -> dict[str, Any]:
    """The DistributedDataParallel keyword arguments ``cfg.ddp`` asks for (see the module docstring)."""
    d = cfg.ddp
    kwargs: dict[str, Any] = {
        "find_unused_parameters": d.find_unused_parameters,
        "gradient_as_bucket_view": d.gradient_as_bucket_view,
        "static_graph": d.static_graph,
    }
    if _ddp_accepts("forward_sync_buffers"):
        kwargs["forward_sync_buffers"] = d.broadcast_buffers
    else:
        kwargs["broadcast_buffers"] = d.broadcast_buffers
    if d.bucket_cap_mb is not None:
        kwargs["bucket_cap_mb"] = d.bucket_cap_mb
    if device.type == "cuda":
        kwargs["device_ids"] = [device.index if device.index is not None else torch.cuda.current_device()]
    return kwargs


@contextmanager
def _no_sync(chunks: list[nn.Module]) -> Iterator[None]:
    with ExitStack() as stack:
        for chunk in chunks:
            stack.enter_context(chunk.no_sync())
        yield


def _replicate(chunk: nn.Module, dp_mesh: DeviceMesh | None, expert_parallel: ExpertParallel | None) -> nn.Module:
    """torch's FSDP-based ``replicate`` (data parallelism that composes with every pipeline schedule); expert-parallel
    weights are left to :class:`~megatron_bridge.distributed.expert_parallel.ExpertParallel`."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    own = {id(p) for p in expert_parallel.all_params()} if expert_parallel is not None else set()
    ignored = {p for p in chunk.parameters() if id(p) in own}
    return replicate(chunk, mesh=dp_mesh, ignored_params=ignored or None)


def _is_zero(optimizer: torch.optim.Optimizer) -> bool:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return isinstance(optimizer, ZeroRedundancyOptimizer)


class DDPBackend(DataParallelBackend):
    """torch DistributedDataParallel around each model chunk, configured by ``cfg.ddp``."""

    name = "ddp"

    def __init__(self, cfg: "ConfigContainer", device: torch.device) -> None:
        super().__init__(cfg, device)
        self.autocast_dtype = resolve_autocast_dtype("ddp.autocast_dtype", cfg.ddp.autocast_dtype, cfg,
                                                     use_preset=True)
        self.replicated = False
        """Chunks wrapped with torch's FSDP-based ``replicate`` (pipeline or tensor parallelism), not DDP."""

    def wrap(self, model_chunks: list[nn.Module]) -> list[nn.Module]:
        """Materialize meta chunks, apply activation checkpointing, wrap each chunk in DDP."""
        enforce(self.cfg, "engine_parallel_layout")
        env = initialize_distributed(self.cfg)
        settings = ac_settings(self.cfg, "ddp")
        kwargs = ddp_kwargs(self.cfg, self.device)
        cp_mesh = dp_mesh = tp_mesh = None
        if self.cfg.model.context_parallel_size > 1 or self.pipelined or self.cfg.model.tensor_model_parallel_size > 1:
            mesh = build_device_mesh(self.cfg, env)
            (dp_mesh, tp_mesh), cp_mesh, pp_mesh = split_mesh(mesh), context_parallel_mesh(mesh), pipeline_mesh(mesh)
            self.pp_group = pp_mesh.get_group() if pp_mesh is not None else None
            kwargs["process_group"] = dp_mesh.get_group()  # reduce over data-parallel × context-parallel ranks
        self.expert_parallel = apply_expert_parallel(model_chunks, self.cfg, env, self.device, tp_mesh)
        use_replicate = self.replicated = self.pipelined or tp_mesh is not None
        wrapped = []
        for chunk in model_chunks:
            if has_meta_params([chunk]):
                materialize_meta_model(chunk, self.device)
            else:
                chunk.to(self.device)
            if tp_mesh is not None:
                apply_tensor_parallel(chunk, tp_mesh, self.cfg)
            if cp_mesh is not None:
                enforce(self.cfg, "cp_ring_needs_cuda")
                apply_context_parallel(chunk, cp_mesh, self.cfg)
            apply_ac_settings(chunk, settings)
            ignore_in_ddp(chunk, self.expert_parallel)
            wrapped.append(_replicate(chunk, dp_mesh, self.expert_parallel) if use_replicate
                           else DistributedDataParallel(chunk, **kwargs))
        self.chunks = wrapped
        self.tie_embeddings()
        if use_replicate:
            why = (f"pipeline parallelism ({resolve_schedule(self.cfg.model)})" if self.pipelined else
                   f"tensor parallelism (TP={self.cfg.model.tensor_model_parallel_size})")
            log_rank_0(logger, "DDP under %s: %d chunk(s) wrapped with torch's FSDP-based replicate over the "
                       "data-parallel group (classic DistributedDataParallel breaks under pipeline schedules and "
                       "cannot wrap DTensor parameters); ddp.bucket_cap_mb/static_graph/find_unused_parameters do "
                       "not apply, autocast %s", why, len(wrapped), self.autocast_dtype)
        else:
            log_rank_0(logger, "DDP: wrapped %d chunk(s) (%s), autocast %s", len(wrapped),
                       ", ".join(f"{k}={v}" for k, v in kwargs.items() if k != "process_group"), self.autocast_dtype)
        return wrapped

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """With ``optimizer.use_distributed_optimizer``: the same optimizer as ZeRO-1 (torch's
        ZeroRedundancyOptimizer, :mod:`megatron_bridge.distributed.zero`); otherwise ``optimizer`` itself."""
        if not self.cfg.optimizer.use_distributed_optimizer:
            return optimizer
        if self.cfg.model.pipeline_model_parallel_size > 1:  # ranks of different stages hold different parameters
            warn_once(logger, "ddp_zero_pipeline", "optimizer.use_distributed_optimizer with DDP and pipeline "
                      "parallelism: the optimizer state stays replicated within each stage in this version (ZeRO-1 "
                      "over the data-parallel group of a stage is not wired yet)")
            return optimizer
        if self.cfg.model.tensor_model_parallel_size > 1:  # DTensor parameters: torch's ZeRO takes plain tensors
            warn_once(logger, "ddp_zero_tensor_parallel", "optimizer.use_distributed_optimizer with DDP and tensor "
                      "parallelism: the optimizer state stays replicated over the data-parallel ranks in this version "
                      "(torch's ZeroRedundancyOptimizer does not take DTensor parameters; dist.use_torch_fsdp2=True "
                      "shards it)")
            return optimizer
        from megatron_bridge.distributed.zero import shard_optimizer

        return shard_optimizer(optimizer)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Replicated optimizer state keyed by parameter name (the ZeRO shards are gathered: collective)."""
        if not _is_zero(optimizer):
            return super().optimizer_state_dict(optimizer)
        from megatron_bridge.distributed.zero import full_state_dict

        return full_state_dict(optimizer, _as_module(self.chunks))

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load a replicated state dict; with ZeRO every rank keeps its own shard."""
        if not _is_zero(optimizer):
            super().load_optimizer_state_dict(optimizer, state)
            return
        from megatron_bridge.distributed.zero import load_full_state_dict

        load_full_state_dict(optimizer, _as_module(self.chunks), state)

    def forward_context(self) -> AbstractContextManager:
        """``torch.autocast`` when an autocast dtype is configured (or implied by a preset)."""
        return autocast_context(self.device, self.autocast_dtype)

    def grad_sync_context(self, *, is_last_microbatch: bool) -> AbstractContextManager:
        """``no_sync()`` on every chunk except for the last micro-batch (pipeline stages sync themselves); chunks
        wrapped with ``replicate`` (tensor parallelism) all-reduce only in the last micro-batch's backward."""
        if self.pipelined:
            return nullcontext()
        if self.replicated:
            for chunk in self.chunks:
                chunk.set_requires_gradient_sync(is_last_microbatch)  # type: ignore[operator]
            return nullcontext()
        if is_last_microbatch:
            return nullcontext()
        return _no_sync(self.chunks)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Global gradient norm (clipping when ``max_norm > 0``); NaN/Inf raise with ``ddp.check_for_nan_in_grad``."""
        norm = super().clip_grad_norm(max_norm)
        check_grad_norm_finite(norm, self.cfg)
        return norm
