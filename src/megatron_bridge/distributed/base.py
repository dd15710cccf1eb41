"""The one small interface every data-parallel backend implements, so the training loop never branches on it.

A backend is built by :func:`megatron_bridge.engines.ddp_wrap.ddp_wrap` from the config. The loop calls, per step:
``grad_sync_context`` around each micro-batch's backward, ``forward_context`` around each forward,
``finish_grad_sync`` after the last micro-batch, ``optimizer_step`` (``clip_grad_norm``, then ``optimizer.step()``).
Checkpointing uses ``model_state_dict`` / ``load_model_state_dict`` and the optimizer variants (DCP-ready state
dicts). With expert parallelism (``expert_parallel``, :mod:`.expert_parallel`) the base methods also reduce and clip
the expert gradients and give the expert weights their global, EP-independent checkpoint shape. With tied embeddings
under pipeline parallelism (``tied_embeddings``, :mod:`.tied_embeddings`) they sum the tied weight's gradient over
the first and last stage and count it once in the norms.
"""

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.distributed.expert_parallel import ExpertParallel
    from megatron_bridge.distributed.tied_embeddings import TiedEmbeddings


class DataParallelBackend(ABC):
    """Wraps model chunks for data parallelism and exposes what the loop and checkpointing need."""

    name: ClassVar[str]
    """Short backend name used in logs and results ("ddp", "fsdp2", "megatron_fsdp")."""

    def __init__(self, cfg: "ConfigContainer", device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.chunks: list[nn.Module] = []
        self.expert_parallel: ExpertParallel | None = None
        """Expert-parallel state when ``model.expert_model_parallel_size > 1`` (set by ``wrap``)."""
        self.pp_group: dist.ProcessGroup | None = None
        """The pipeline-parallel group (PP > 1): gradient and parameter norms are summed over it."""
        self.tied_embeddings: TiedEmbeddings | None = None
        """The tied embedding weight of the first/last pipeline stage (tied embeddings at PP > 1; set by ``wrap``)."""

    @property
    def pipelined(self) -> bool:
        """True when the chunks are pipeline stages (``model.pipeline_model_parallel_size > 1``)."""
        return self.cfg.model.pipeline_model_parallel_size > 1

    def sum_over_pipeline(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` summed over the pipeline stages (unchanged without PP)."""
        if self.pp_group is not None:
            dist.all_reduce(value, group=self.pp_group)
        return value

    def tie_embeddings(self) -> None:
        """After ``wrap``: with tied embeddings under PP, set up :attr:`tied_embeddings` and give the last stage's
        copy the first stage's values (collective)."""
        from megatron_bridge.distributed.tied_embeddings import TiedEmbeddings

        self.tied_embeddings = TiedEmbeddings.build(self.cfg, [self.unwrap(c) for c in self.chunks], self.pp_group)
        if self.tied_embeddings is not None:
            self.tied_embeddings.broadcast_weight()

    @abstractmethod
    def wrap(self, model_chunks: list[nn.Module]) -> list[nn.Module]:
        """Wrap (and, for meta-device models, materialize) the chunks; stores and returns the wrapped chunks."""

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Hook for backends that shard the optimizer themselves (Megatron FSDP); identity by default."""
        return optimizer

    def forward_context(self) -> AbstractContextManager:
        """Context around each forward pass (autocast when configured)."""
        return nullcontext()

    def grad_sync_context(self, *, is_last_microbatch: bool) -> AbstractContextManager:
        """Context around a micro-batch's forward+backward: gradient sync only on the last micro-batch."""
        return nullcontext()

    def finish_grad_sync(self) -> None:
        """Wait for outstanding gradient reductions (after the last micro-batch's backward); with expert
        parallelism, reduce the expert gradients over the expert-data-parallel group; with tied embeddings under PP,
        sum the tied weight's gradient over the first and last stage."""
        if self.expert_parallel is not None:
            self.expert_parallel.reduce_grads()
        if self.tied_embeddings is not None:
            self.tied_embeddings.reduce_grads()

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Reset gradients before a step's first micro-batch."""
        optimizer.zero_grad(set_to_none=True)

    def parameters(self) -> list[nn.Parameter]:
        """All trainable parameters of the wrapped chunks (DTensors for sharded backends)."""
        return [p for chunk in self.chunks for p in chunk.parameters() if p.requires_grad]

    def counted_parameters(self) -> list[nn.Parameter]:
        """:meth:`parameters` as the norms count them: the last stage's copy of a tied embedding left out."""
        params = self.parameters()
        return self.tied_embeddings.counted(params) if self.tied_embeddings is not None else params

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Global L2 norm of the gradients over all ranks (before clipping); clips when ``max_norm > 0``.

        Under pipeline parallelism the norm covers every stage: each rank's norm is squared, summed over the
        pipeline group, and every stage clips with the global norm. A tied embedding counts once (its last-stage copy
        is clipped, not counted).
        """
        if self.expert_parallel is not None:
            return self.expert_parallel.clip_grad_norm(self.parameters(), max_norm, self.device,
                                                       counted=self.counted_parameters()).detach()
        grads = [p for p in self.parameters() if p.grad is not None]
        if self.pp_group is not None:
            counted = {id(p) for p in self.counted_parameters()}
            return self._clip_over_pipeline(grads, max_norm, [p for p in grads if id(p) in counted])
        if not grads:
            return torch.zeros((), device=self.device)
        norm = torch.nn.utils.clip_grad_norm_(grads, max_norm if max_norm > 0 else float("inf"), foreach=None)
        if hasattr(norm, "full_tensor"):  # DTensor norm of sharded gradients
            norm = norm.full_tensor()
        return norm.detach()

    def _clip_over_pipeline(self, params: list[nn.Parameter], max_norm: float, counted: list[nn.Parameter]
                            ) -> torch.Tensor:
        """Clip ``params`` by the norm of ``counted``'s gradients over all stages; returns that norm."""
        local = torch.zeros((), device=self.device, dtype=torch.float32)
        if counted:
            norm = torch.nn.utils.get_total_norm([p.grad for p in counted], foreach=None)
            if hasattr(norm, "full_tensor"):  # DTensor norm of sharded gradients
                norm = norm.full_tensor()
            local = norm.detach().to(torch.float32)
        total = self.sum_over_pipeline(local.pow(2)).sqrt()
        if max_norm > 0 and params:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=None)
        return total

    def optimizer_step(self, optimizer: torch.optim.Optimizer, max_norm: float,
                       grad_scaler: torch.amp.GradScaler | None = None) -> float:
        """Clip and step after the step's gradients are reduced; returns the gradient norm before clipping.

        Unscales (fp16 ``grad_scaler``), clips with :meth:`clip_grad_norm`, then steps the optimizer (through the
        scaler, which skips steps with Inf/NaN gradients). Backends whose optimizer clips inside its own step
        (megatron-core's) override this.
        """
        if grad_scaler is not None:
            grad_scaler.unscale_(optimizer)
        grad_norm = float(self.clip_grad_norm(max_norm))
        if grad_scaler is not None:
            grad_scaler.step(optimizer)
            grad_scaler.update()
        else:
            optimizer.step()
        return grad_norm

    def unwrap(self, chunk: nn.Module) -> nn.Module:
        """The user's module inside a wrapped chunk."""
        return getattr(chunk, "module", chunk)

    def model_state_dict(self) -> dict[str, Any]:
        """Model state for checkpointing: one entry per chunk ("model" or "model0", "model1", ...).

        Pipeline stages keep the full model's parameter names, so under PP every chunk of every stage goes into one
        ``"model"`` entry: each rank holds its stages' keys, and a checkpoint loads at any PP/VPP layout. The weights
        only: buffers of modelopt quantizers are saved apart (megatron_bridge.optimization.state).
        """
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        from megatron_bridge.models.quantizer_keys import without_quantizer_keys

        states = [without_quantizer_keys(get_model_state_dict(chunk)) for chunk in self.chunks]
        if self.expert_parallel is not None:
            states = [self.expert_parallel.globalize(state, i) for i, state in enumerate(states)]
        if self.pipelined:
            return {"model": {k: v for s in states for k, v in s.items()}}
        return _by_chunk(states)

    def load_model_state_dict(self, state: dict[str, Any]) -> None:
        """Load what ``model_state_dict`` returned (after DCP filled it in place); quantizer buffers are kept."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        from megatron_bridge.models.quantizer_keys import is_quantizer_key

        if self.expert_parallel is not None:
            state = self.expert_parallel.to_live(state)
        if self.pipelined:
            merged = state["model"]
            for chunk in self.chunks:
                set_model_state_dict(chunk, {k: merged[k] for k in get_model_state_dict(chunk)})
            return
        for chunk, chunk_state in zip(self.chunks, _from_chunks(state, len(self.chunks))):
            live = {k: v for k, v in get_model_state_dict(chunk).items() if is_quantizer_key(k)}
            set_model_state_dict(chunk, {**chunk_state, **live} if live else chunk_state)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Optimizer state for checkpointing, flat and keyed by parameter names (``state.<fqn>.exp_avg``,
        ``param_groups.<fqn>.lr``): DCP-ready, reshardable, and free of collisions between pipeline stages."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        state = get_optimizer_state_dict(_as_module(self.chunks), optimizer, options=_FLAT)
        if self.expert_parallel is not None:
            state = self.expert_parallel.globalize_optimizer(state)
        return state

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load what ``optimizer_state_dict`` returned."""
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        if self.expert_parallel is not None:
            state = self.expert_parallel.to_live(state)
        set_optimizer_state_dict(_as_module(self.chunks), optimizer, state, options=_FLAT)


_FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


def _by_chunk(states: list[dict[str, Any]]) -> dict[str, Any]:
    if len(states) == 1:
        return {"model": states[0]}
    return {f"model{i}": s for i, s in enumerate(states)}


def _from_chunks(state: dict[str, Any], n: int) -> list[dict[str, Any]]:
    if n == 1:
        return [state["model"]]
    return [state[f"model{i}"] for i in range(n)]


def _as_module(chunks: list[nn.Module]) -> nn.Module:
    """One module over the chunks for torch's optimizer state-dict API (which takes one root module)."""
    return chunks[0] if len(chunks) == 1 else pipeline_view(chunks)


def pipeline_view(chunks: list[nn.Module]) -> nn.Module:
    """A module whose parameter names are the full model's, over several pipeline-stage chunks of one rank: their
    children are registered on one root (``ModuleDict`` children such as ``layers`` merged by key, so
    ``layers.5.*`` keeps its name). The chunks' modules are shared, not copied."""
    view = nn.Module()
    for chunk in chunks:
        for name, child in chunk.named_children():
            if child is None:
                continue
            existing = getattr(view, name, None)
            if isinstance(existing, nn.ModuleDict) and isinstance(child, nn.ModuleDict):
                existing.update(child)
            elif existing is None:
                view.add_module(name, nn.ModuleDict(child) if isinstance(child, nn.ModuleDict) else child)
    return view
