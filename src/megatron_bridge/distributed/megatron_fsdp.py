"""The Megatron FSDP backend (``dist.use_megatron_fsdp``): megatron-fsdp's ``fully_shard_model`` and
``fully_shard_optimizer``.

``wrap()`` shards the model (``fully_shard_model``), ``prepare_optimizer()`` shards the optimizer
(``fully_shard_optimizer``), the split the megatron-fsdp 0.6.1 API documents. Every ``cfg.ddp`` option goes through
the pure function ``megatron_fsdp_kwargs`` (:mod:`.megatron_fsdp_compat`, re-exported here, unit-tested on CPU
against the installed signature); the table is in docs/training/megatron-fsdp.md. Options the installed
megatron-fsdp does not accept raise a MegatronBridgeError naming the option, the version and the fix. megatron-fsdp
has no CPU code path: without CUDA ``wrap()`` raises before calling into the package.

Context parallelism (``model.context_parallel_size > 1``): as megatron-core's adapter does, megatron-fsdp gets a
``("dp_cp", "tp")`` mesh whose ``"dp_cp"`` dimension is the flattened data × context-parallel group, so parameters,
gradients and optimizer state are sharded, and gradients reduced, over dp × cp ranks (PP = 1 here);
the attention modules get the CP attention over the ``"cp"`` group of the layout's mesh (:mod:`.context_parallel`,
the same path as DDP and FSDP2).

Tensor parallelism (``model.tensor_model_parallel_size > 1``): the mesh is ``(dp × cp, TP)``; the TP plan of
:mod:`.tensor_parallel` (FSDP2's) is applied over ``"tp"`` before ``fully_shard_model``, its DTensor parameters
handed to megatron-fsdp as TP-local ones (:mod:`.megatron_fsdp_tp` says why), so megatron-fsdp shards each
parameter's TP part over ``"dp_cp"``.

Mixture-of-experts models: :mod:`.expert_parallel` keeps each rank's experts (EP folded over tp × dp × cp), and
megatron-fsdp gets an expert mesh whose ``"dp_cp"`` groups are the expert-data-parallel groups, so the routed
experts' parameters, gradients and optimizer state are sharded and reduced over those (:mod:`.megatron_fsdp_experts`,
which also gives checkpoints the global ``[E, ...]`` expert tensors).
"""

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from megatron_bridge.config.adjustments import apply_adjustment
from megatron_bridge.config.rule_set import enforce
from megatron_bridge.distributed import megatron_fsdp_compat as compat
from megatron_bridge.distributed.activation_checkpointing import ACSettings, ac_settings, apply_ac_settings
from megatron_bridge.distributed.base import DataParallelBackend, _by_chunk, _from_chunks
from megatron_bridge.distributed.common import (
    autocast_context,
    has_meta_params,
    resolve_autocast_dtype,
)
from megatron_bridge.distributed.context_parallel import apply_context_parallel
from megatron_bridge.distributed.expert_parallel import apply_expert_parallel
from megatron_bridge.distributed.megatron_fsdp_compat import (
    MESH_DIM_NAMES,
    apply_communication_unit_size,
    log_forced_overlap,
    megatron_fsdp_kwargs,
)
from megatron_bridge.distributed.megatron_fsdp_experts import ExpertCheckpointView, expert_device_mesh
from megatron_bridge.distributed.megatron_fsdp_tp import (
    check_same_groups,
    fsdp_mesh_shape,
    grad_copies,
    local_tensor_parallel_params,
)
from megatron_bridge.distributed.tensor_parallel import apply_tensor_parallel
from megatron_bridge.errors import CheckpointError, MegatronBridgeError
from megatron_bridge.utils.logging import get_logger, log_rank_0, warn_once


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.distributed.init import DistEnv

logger = get_logger(__name__)

__all__ = ["MegatronFSDPBackend", "megatron_fsdp_kwargs"]


# ------------------------------------------------------------------------------------------ config helpers
def warn_legacy_nan_check(cfg: "ConfigContainer") -> None:
    """The once-per-process warning for ``ddp.check_for_nan_in_grad`` (never passed to megatron-fsdp), also when
    ``validate()`` was skipped: the config layer's ``legacy_check_for_nan_in_grad`` adjustment."""
    apply_adjustment(cfg, "legacy_check_for_nan_in_grad")


def activation_checkpointing_settings(cfg: "ConfigContainer") -> ACSettings | None:
    """``model.recompute_granularity`` (whole blocks / selective), else ``ddp.megatron_fsdp_mlp_activation_
    checkpointing`` (each block's MLP), else None. ``ddp.activation_checkpointing`` is a DDP option (logged)."""
    d = cfg.ddp
    if cfg.model.recompute_granularity is not None:
        if d.megatron_fsdp_mlp_activation_checkpointing:
            warn_once(logger, "mfsdp_mlp_ac_redundant", "ddp.megatron_fsdp_mlp_activation_checkpointing=True is "
                      "redundant with model.recompute_granularity=%r: blocks are checkpointed",
                      cfg.model.recompute_granularity)
        return ac_settings(cfg, "ddp")
    if d.activation_checkpointing not in (False, None):
        warn_once(logger, "mfsdp_ddp_ac_ignored", "ddp.activation_checkpointing=%r is a DDP option and is ignored by "
                  "Megatron FSDP: use model.recompute_granularity or ddp.megatron_fsdp_mlp_activation_checkpointing",
                  d.activation_checkpointing)
    if d.megatron_fsdp_mlp_activation_checkpointing:
        return ACSettings("full", ("all",), True, None, "ddp.megatron_fsdp_mlp_activation_checkpointing")
    return None


# ------------------------------------------------------------------------------------------ meta-device init
class MetaInitReplay:
    """``reset_parameters()`` for the modules megatron-fsdp materializes from the meta device
    (``init_model_with_meta_device``), reproducing LlamaModel.init_weights bit for bit.

    init_weights draws ``normal(0, init_method_std)`` for every Linear/Embedding weight in module order (output
    projections: std / sqrt(2 * num_layers); biases zero) from the device's default generator. megatron-fsdp
    initializes module by module, so each reset replays the draws of the modules before it on a generator cloned
    from the state at wrap time (scratch draws, one tensor alive at a time; linear cost when megatron-fsdp visits
    modules in order). :meth:`finish` leaves the default generator where a direct build leaves it. Other modules
    with meta parameters keep their own ``reset_parameters`` (norms).
    """

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        from megatron_bridge.models.llama import _OUTPUT_PROJECTION

        config = getattr(model, "config", None)
        std, layers = getattr(config, "init_method_std", None), getattr(config, "num_layers", None)
        self.device = device
        self.default = (torch.cuda.default_generators[device.index if device.index is not None else 0]
                        if device.type == "cuda" else torch.default_generator)
        self.start = self.default.get_state()
        self.plan: list[tuple[nn.Module, float]] = []
        if std is not None and layers:
            for module in model.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    out = getattr(module, _OUTPUT_PROJECTION, False)
                    self.plan.append((module, std / (2.0 * layers) ** 0.5 if out else std))
        self.index = {id(m): k for k, (m, _) in enumerate(self.plan)}
        self.gen: torch.Generator | None = None
        self.next = 0
        for name, module in model.named_modules():
            if not any(p.is_meta for p in module.parameters(recurse=False)):
                continue
            if id(module) in self.index:
                module.reset_parameters = _bound_reset(self, module)
            elif not callable(getattr(module, "reset_parameters", None)):
                raise MegatronBridgeError(
                    f"model.init_model_with_meta_device=True: module {name!r} ({type(module).__name__}) has meta "
                    "parameters but no reset_parameters(), which megatron-fsdp calls to initialize it. Fix: set "
                    "model.init_model_with_meta_device=False."
                )

    def _draw(self, k: int) -> torch.Tensor:
        module, std = self.plan[k]
        shape = module.weight.shape
        return torch.empty(shape, dtype=torch.float32, device=self.device).normal_(0.0, std, generator=self.gen)

    def reset(self, module: nn.Module) -> None:
        """Initialize ``module`` (already allocated by megatron-fsdp) with its init_weights values."""
        k = self.index[id(module)]
        if self.gen is None or self.next > k:
            self.gen = torch.Generator(device=self.device)
            self.gen.set_state(self.start)
            self.next = 0
        while self.next < k:
            self._draw(self.next)
            self.next += 1
        with torch.no_grad():
            module.weight.copy_(self._draw(k))
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
        self.next = k + 1

    def finish(self) -> None:
        """Advance the device's default generator past every draw, as a direct build does."""
        if self.gen is None:
            return
        while self.next < len(self.plan):
            self._draw(self.next)
            self.next += 1
        self.default.set_state(self.gen.get_state())


def _bound_reset(replay: MetaInitReplay, module: nn.Module) -> Any:
    def reset_parameters() -> None:
        replay.reset(module)

    return reset_parameters


def materialize_meta_buffers(model: nn.Module, device: torch.device) -> None:
    """Allocate and re-initialize buffers megatron-fsdp left on the meta device (parameter-less modules such as
    the rotary embedding) with their module's ``reset_parameters()``."""
    for name, module in model.named_modules():
        if any(b.is_meta for b in module.buffers(recurse=False)):
            if any(p.is_meta for p in module.parameters(recurse=False)) or not hasattr(module, "reset_parameters"):
                raise MegatronBridgeError(f"module {name!r} still has meta tensors after megatron-fsdp's meta init and "
                                          "no reset_parameters(): set model.init_model_with_meta_device=False.")
            module.to_empty(device=device, recurse=False)
            module.reset_parameters()


# ------------------------------------------------------------------------------------------------ backend
class MegatronFSDPBackend(DataParallelBackend):
    """Megatron FSDP (megatron-fsdp) over the dp × cp ranks (of each TP rank): ZeRO-1/2/3 or DDP-like, per
    ``ddp.data_parallel_sharding_strategy``. Needs CUDA; checkpoints in ``fsdp_dtensor`` (DCP of DTensor state
    dicts)."""

    name = "megatron_fsdp"

    def __init__(self, cfg: "ConfigContainer", device: torch.device) -> None:
        super().__init__(cfg, device)
        self.autocast_dtype = resolve_autocast_dtype("ddp.autocast_dtype", None, cfg, use_preset=True)
        self.mesh: Any = None
        """megatron-fsdp's ``("dp_cp", "tp")`` mesh of (dp × cp, tp): it shards and reduces over ``"dp_cp"``."""
        self.cp_mesh: Any = None
        """The context-parallel mesh (None without CP)."""
        self.tp_mesh: Any = None
        """The ``"tp"`` sub-mesh of :attr:`mesh` (None without TP)."""
        self._grads_synced = False
        self._deferred_scaling: list[tuple[list[nn.Parameter], float]] = []
        """Gradients megatron-fsdp leaves unscaled, with their factor (``compat.defer_single_rank_grad_scaling``)."""
        self.expert_view: ExpertCheckpointView | None = None
        """The checkpoint view of EP-split expert parameters (EP > 1), else None."""

    def wrap(self, model_chunks: list[nn.Module]) -> list[nn.Module]:
        """Shard the (single) chunk with ``megatron_fsdp.fully_shard_model``; meta chunks are materialized shard by
        shard by megatron-fsdp. Raises MegatronBridgeError without CUDA or for unsupported options."""
        from megatron_bridge.distributed.init import initialize_distributed

        cfg = self.cfg
        warn_legacy_nan_check(cfg)
        apply_adjustment(cfg, "megatron_fsdp_average_in_collective")
        enforce(cfg, "megatron_fsdp_expert_tensor_parallel", "pipeline_megatron_fsdp", "engine_parallel_layout",
                "megatron_fsdp_async_save", "megatron_fsdp_meta_init")
        if len(model_chunks) != 1:
            raise MegatronBridgeError(f"Megatron FSDP wraps one model chunk; got {len(model_chunks)}.")
        compat.require_cuda(self.device)
        mfsdp = compat.import_megatron_fsdp()
        compat.check_ddp_config_compatible(mfsdp.fully_shard_model)
        chunk = model_chunks[0]
        kwargs = megatron_fsdp_kwargs(cfg, chunk)
        log_forced_overlap(cfg)
        env = initialize_distributed(cfg)
        self.mesh, self.cp_mesh = self._meshes(env)
        self.tp_mesh = self.mesh[MESH_DIM_NAMES[1]] if cfg.model.tensor_model_parallel_size > 1 else None
        if cfg.model.is_moe:  # before TP, CP and activation checkpointing (the expert names are the state dict's)
            kwargs["expt_device_mesh"] = self._experts(chunk, env)
        if self.tp_mesh is not None:  # whole first (MetaInitReplay draws full tensors), then split over "tp"
            if has_meta_params([chunk]):
                from megatron_bridge.models.provider import materialize_meta_model

                materialize_meta_model(chunk, self.device)
            apply_tensor_parallel(chunk, self.tp_mesh, cfg)
            local_tensor_parallel_params(chunk)
        if self.cp_mesh is not None:
            enforce(cfg, "cp_ring_needs_cuda")
            apply_context_parallel(chunk, self.cp_mesh, cfg)
        settings = activation_checkpointing_settings(cfg)
        if settings is not None:
            apply_ac_settings(chunk, settings)
        on_meta = has_meta_params([chunk])
        replay = MetaInitReplay(chunk, self.device) if on_meta else None
        wrapped = mfsdp.fully_shard_model(module=chunk, device_mesh=self.mesh, device=self.device, **kwargs)
        if replay is not None:
            replay.finish()
            materialize_meta_buffers(wrapped.module, self.device)
        apply_communication_unit_size(wrapped, cfg.ddp.bucket_size)
        self._deferred_scaling = compat.defer_single_rank_grad_scaling(wrapped)
        self.chunks = [wrapped]
        cp, tp = cfg.model.context_parallel_size, cfg.model.tensor_model_parallel_size
        log_rank_0(logger, "Megatron FSDP %s: %s on %d rank(s) (dp %d × cp %d × tp %d), units %s",
                   compat.installed_version(), cfg.ddp.data_parallel_sharding_strategy, env.world_size,
                   env.world_size // (cp * tp), cp, tp, [c.__name__ for c in kwargs["fsdp_unit_modules"]])
        return self.chunks

    def _experts(self, chunk: nn.Module, env: "DistEnv") -> Any:
        """An MoE chunk: keep this rank's experts (EP > 1, :mod:`.expert_parallel`; a meta chunk is materialized
        whole, as :class:`MetaInitReplay` replays linear and embedding draws only) and return megatron-fsdp's expert
        mesh (:mod:`.megatron_fsdp_experts`)."""
        from megatron_bridge.models.provider import materialize_meta_model

        self.expert_parallel = apply_expert_parallel([chunk], self.cfg, env, self.device, self.tp_mesh)
        self.expert_view = ExpertCheckpointView.of(self.expert_parallel)
        if has_meta_params([chunk]):
            materialize_meta_model(chunk, self.device)
        return expert_device_mesh(self.cfg, env)

    def _meshes(self, env: "DistEnv") -> tuple[Any, Any]:
        """megatron-fsdp's ``("dp_cp", "tp")`` mesh (:mod:`.megatron_fsdp_tp`) and, with CP, the ``"cp"`` mesh of
        the layout.

        The layout's mesh is ``("dp"[, "cp"][, "tp"])`` (PP = 1 under Megatron FSDP) with TP innermost: its
        ``"dp_cp"`` (or ``"dp"``) groups are the rows of megatron-fsdp's ``(world / TP, TP)`` mesh and its ``"tp"``
        groups the columns (checked).
        """
        from torch.distributed.device_mesh import init_device_mesh

        from megatron_bridge.distributed.init import build_device_mesh, context_parallel_mesh, split_mesh

        m = self.cfg.model
        shape = fsdp_mesh_shape(env.world_size, m.tensor_model_parallel_size)
        mesh = init_device_mesh(self.device.type, shape, mesh_dim_names=MESH_DIM_NAMES)
        if m.context_parallel_size <= 1 and m.tensor_model_parallel_size <= 1:
            return mesh, None
        layout = build_device_mesh(self.cfg, env)
        check_same_groups(mesh, *split_mesh(layout))
        return mesh, context_parallel_mesh(layout)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Shard the optimizer with ``megatron_fsdp.fully_shard_optimizer`` (in place; returns it).

        Parameters of the unwrapped model are swapped for megatron-fsdp's distributed ones (param groups and their
        hyper-parameters are kept). fully_shard_optimizer's warm-up step runs with lr=0 and the state it creates is
        zeroed (step counters, moments, momentum buffers), so the first real step behaves as a fresh optimizer's.
        ``optimizer.step()`` skips megatron-fsdp's own gradient sync when :meth:`finish_grad_sync` already ran, and
        all-gathers the updated parameters when ``overlap_param_gather`` is off (ZeRO-1/2; megatron-fsdp's own step
        wrapper does not).
        """
        mfsdp = compat.import_megatron_fsdp()
        chunk = self._chunk()
        chunk._replace_param_with_distributed_if_needed()
        _retarget_params(optimizer, chunk)
        saved_lr = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        mfsdp.fully_shard_optimizer(optimizer, preproc_state_dict_for_dcp_ckpt=True)
        for group, lr in zip(optimizer.param_groups, saved_lr):
            group["lr"] = lr
        for state in optimizer.state.values():  # the warm-up ran on zero gradients: make the state a fresh one's
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    value.zero_()
                elif key == "step":
                    state[key] = 0
        mfsdp_step = optimizer.step
        # Sharded optimizer state without parameter-gather overlap: nothing in the forward gathers the updated
        # shards, so gather them right after the step (as Megatron-Core's distributed optimizer does).
        gather_after_step = chunk.data_parallel_sharding_strategy != "no_shard" and not (
            chunk.ddp_config.overlap_param_gather)

        def step(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("sync_grad_before_optimizer_step", not self._grads_synced)
            self._grads_synced = False
            result = mfsdp_step(*args, **kwargs)
            if gather_after_step:
                chunk.start_param_sync()
            return result

        optimizer.step = step  # type: ignore[method-assign]
        return optimizer

    def forward_context(self) -> AbstractContextManager:
        """``torch.autocast`` in the preset's compute dtype (``optimizer.bf16``/``fp16``); none for fp32."""
        return autocast_context(self.device, self.autocast_dtype)

    def grad_sync_context(self, *, is_last_microbatch: bool) -> AbstractContextManager:
        """With ``overlap_grad_reduce``, gradients are reduced during the last micro-batch's backward (every
        backward when they are sharded); without it, once in :meth:`finish_grad_sync` (megatron-fsdp's
        ``finish_grad_sync`` reduces again then, which a reduction in the backward would double for ZeRO-1)."""
        return _last_microbatch(self.chunks, is_last_microbatch)

    def finish_grad_sync(self) -> None:
        """Wait for the reductions and attach the (DTensor) gradients to the distributed parameters."""
        for chunk in self.chunks:
            chunk.finish_grad_sync()
        for params, factor in self._deferred_scaling:  # megatron-fsdp left these unscaled (compat)
            for param in params:
                if param.grad is not None:
                    _local(param.grad).mul_(factor)
        if self.cfg.ddp.calculate_per_token_loss:  # megatron-fsdp summed; the loop's loss scaling expects a mean
            scale = 1.0 / self.mesh[MESH_DIM_NAMES[0]].size()
            for param in self.parameters():
                if param.grad is not None:
                    _local(param.grad).mul_(scale)
        self._grads_synced = True

    def parameters(self) -> list[nn.Parameter]:
        """The distributed (DTensor) parameters megatron-fsdp optimizes."""
        for chunk in self.chunks:
            chunk._replace_param_with_distributed_if_needed()
        return super().parameters()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Global L2 norm from the local gradient shards (each counted once: ``megatron_fsdp_tp.grad_copies``),
        all-reduced over every rank; clips the shards in place when ``max_norm > 0``. NaN checks:
        ddp.report_nan_in_param_grad (inside megatron-fsdp); ddp.check_for_nan_in_grad is a legacy no-op here."""
        self.parameters()
        ep_split = self.expert_view.names if self.expert_view is not None else frozenset()
        ep = self.expert_view.ep_size if self.expert_view is not None else 1
        named = [(n, p.grad) for c in self.chunks for n, p in c.module.named_parameters() if p.grad is not None]
        grads = [g for _, g in named]
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        world = self.mesh.size() if self.mesh is not None else 1
        for name, grad in named:
            copies = grad_copies(grad, world, ep if name in ep_split else 1)
            total += _local(grad).detach().float().pow(2).sum() / copies
        if world > 1:  # every rank of the (single) stage: dp × cp × tp
            dist.all_reduce(total)
        norm = total.sqrt()
        if max_norm > 0:
            coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
            for grad in grads:
                _local(grad).mul_(coef.to(grad.dtype))
        return norm

    def model_state_dict(self) -> dict[str, Any]:
        """DTensor state dict of each chunk (the main weights; DCP metadata added by megatron-fsdp), keys without
        the wrapper's ``module.`` prefix (the same names as the other backends)."""
        states = []
        for chunk in self.chunks:
            chunk._replace_param_with_distributed_if_needed()
            state = {k.removeprefix("module."): v for k, v in chunk.state_dict().items()}
            states.append(self.expert_view.globalize(state) if self.expert_view is not None else state)
        return _by_chunk(states)

    def load_model_state_dict(self, state: dict[str, Any]) -> None:
        """Load what ``model_state_dict`` returned; megatron-fsdp's load hook installs the weights."""
        for chunk, chunk_state in zip(self.chunks, _from_chunks(state, len(self.chunks))):
            chunk._replace_param_with_distributed_if_needed()
            if self.expert_view is not None:
                chunk_state = self.expert_view.localize(chunk_state)
            chunk.module.load_state_dict(chunk_state, strict=True)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Optimizer state keyed by parameter names (DTensor shards; collective on all ranks)."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        chunk = self._chunk()
        chunk._replace_param_with_distributed_if_needed()
        state = get_optimizer_state_dict(chunk.module, optimizer)
        return self.expert_view.globalize_optimizer(state) if self.expert_view is not None else state

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load what ``optimizer_state_dict`` returned. Parameters whose shard is empty on this rank have no state
        here (megatron-fsdp shards flat buckets unevenly); every other parameter must have some."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        chunk = self._chunk()
        chunk._replace_param_with_distributed_if_needed()
        if self.expert_view is not None:
            state = self.expert_view.localize(state)
        saved = set(state.get("state", {}))
        missing = [name for name, p in chunk.module.named_parameters()
                   if p.requires_grad and _local(p).numel() > 0 and name not in saved]
        if missing:
            raise CheckpointError(f"the checkpoint has no optimizer state for {missing[:5]} (of {len(missing)} "
                                      "parameters): load it with checkpoint.load_optim=False or use a complete one.")
        set_optimizer_state_dict(chunk.module, optimizer, state, options=StateDictOptions(strict=False))

    def _chunk(self) -> nn.Module:
        if len(self.chunks) != 1:
            raise MegatronBridgeError("Megatron FSDP: call wrap() with one model chunk before using the optimizer.")
        return self.chunks[0]


@contextmanager
def _last_microbatch(chunks: list[nn.Module], is_last: bool) -> Iterator[None]:
    for chunk in chunks:
        chunk.is_last_microbatch = is_last and chunk.ddp_config.overlap_grad_reduce
    yield


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def _retarget_params(optimizer: torch.optim.Optimizer, chunk: nn.Module) -> None:
    """Point the optimizer at megatron-fsdp's distributed parameters (swapping any raw parameter by name)."""
    if optimizer.state:
        raise MegatronBridgeError("prepare_optimizer() needs a fresh optimizer (no state yet): megatron-fsdp "
                                  "initializes the sharded state itself.")
    distributed = dict(chunk.param_and_grad_buffer.optimizer_named_parameters)
    raw_to_dist = {id(raw): distributed[name] for name, raw in chunk.raw_param.items() if name in distributed}
    dist_ids = {id(p) for p in distributed.values()}
    for group in optimizer.param_groups:
        swapped = []
        for param in group["params"]:
            if id(param) in dist_ids:
                swapped.append(param)
            elif id(param) in raw_to_dist:
                swapped.append(raw_to_dist[id(param)])
            else:
                raise MegatronBridgeError("the optimizer holds a parameter that is not part of the Megatron FSDP "
                                          "model: build it from backend.chunks after wrap().")
        group["params"] = swapped
