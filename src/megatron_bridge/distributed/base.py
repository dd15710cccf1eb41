"""The one small interface every data-parallel backend implements, so the training loop never branches on it.

A backend is built by :func:`megatron_bridge.distributed.ddp_wrap.ddp_wrap` from the config. The loop calls, per step:
``grad_sync_context`` around each micro-batch's backward, ``forward_context`` around each forward,
``finish_grad_sync`` after the last micro-batch, ``clip_grad_norm`` before ``optimizer.step()``. Checkpointing uses
``model_state_dict`` / ``load_model_state_dict`` and the optimizer variants (DCP-ready state dicts).
"""

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer


class DataParallelBackend(ABC):
    """Wraps model chunks for data parallelism and exposes what the loop and checkpointing need."""

    name: ClassVar[str]
    """Short backend name used in logs and results ("ddp", "fsdp2", "megatron_fsdp")."""

    def __init__(self, cfg: "ConfigContainer", device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.chunks: list[nn.Module] = []

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
        """Wait for outstanding gradient reductions (after the last micro-batch's backward)."""
        return None

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Reset gradients before a step's first micro-batch."""
        optimizer.zero_grad(set_to_none=True)

    def parameters(self) -> list[nn.Parameter]:
        """All trainable parameters of the wrapped chunks (DTensors for sharded backends)."""
        return [p for chunk in self.chunks for p in chunk.parameters() if p.requires_grad]

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Global L2 norm of the gradients over all ranks (before clipping); clips when ``max_norm > 0``."""
        grads = [p for p in self.parameters() if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self.device)
        norm = torch.nn.utils.clip_grad_norm_(grads, max_norm if max_norm > 0 else float("inf"), foreach=None)
        if hasattr(norm, "full_tensor"):  # DTensor norm of sharded gradients
            norm = norm.full_tensor()
        return norm.detach()

    def unwrap(self, chunk: nn.Module) -> nn.Module:
        """The user's module inside a wrapped chunk."""
        return getattr(chunk, "module", chunk)

    def model_state_dict(self) -> dict[str, Any]:
        """Model state for checkpointing: one entry per chunk ("model" or "model0", "model1", ...)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        states = [get_model_state_dict(chunk) for chunk in self.chunks]
        return _by_chunk(states)

    def load_model_state_dict(self, state: dict[str, Any]) -> None:
        """Load what ``model_state_dict`` returned (after DCP filled it in place)."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        for chunk, chunk_state in zip(self.chunks, _from_chunks(state, len(self.chunks))):
            set_model_state_dict(chunk, chunk_state)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Optimizer state for checkpointing, keyed by parameter names (DCP-ready, reshardable)."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(_as_module(self.chunks), optimizer)

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load what ``optimizer_state_dict`` returned."""
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(_as_module(self.chunks), optimizer, state)


def _by_chunk(states: list[dict[str, Any]]) -> dict[str, Any]:
    if len(states) == 1:
        return {"model": states[0]}
    return {f"model{i}": s for i, s in enumerate(states)}


def _from_chunks(state: dict[str, Any], n: int) -> list[dict[str, Any]]:
    if n == 1:
        return [state["model"]]
    return [state[f"model{i}"] for i in range(n)]


def _as_module(chunks: list[nn.Module]) -> nn.Module | list[nn.Module]:
    return chunks[0] if len(chunks) == 1 else chunks
