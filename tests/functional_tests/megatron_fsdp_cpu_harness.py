"""Test-only: run megatron-fsdp's CUDA code path on CPU/gloo, deterministically. Never imported by the library.

megatron-fsdp hard-codes CUDA streams and events, ``.cuda()``, ``torch.cuda.current_device()`` and the NCCL-only
``PREMUL_SUM`` reduction. A shim that only turns those into no-ops still lets gloo run the collectives megatron-fsdp
issues with ``async_op=True`` (and inside ``_coalescing_manager``) in the background while the Python side reuses
and frees the buffers: CUDA stream order protects them on a GPU, nothing does on CPU, and such shims crashed
(SIGSEGV, heap corruption) in 8-27 % of runs. :func:`install` therefore makes every collective synchronous:

* ``torch.cuda``: ``Stream``/``Event`` objects whose waits and records are no-ops, ``stream()`` a null context,
  ``current_stream``, ``current_device`` (0), ``synchronize``, ``empty_cache``; ``Tensor.cuda()`` returns the tensor;
* ``torch.distributed`` collectives (``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``,
  ``all_gather``, ``broadcast``): run with ``async_op=False`` and, when async was asked for, return a completed
  work handle; ``ReduceOp.AVG`` (not in gloo) becomes SUM divided by the group size;
* megatron-fsdp's ``_coalescing_manager``: a context that issues nothing itself (the ops inside already ran,
  synchronously) and yields a completed handle; its gradient pre-scaling always uses plain SUM (no PREMUL_SUM);
* the backend's CUDA guard (``megatron_fsdp_compat.require_cuda``) is disabled.

With these, every megatron-fsdp communication happens in program order, as CUDA stream order guarantees on a GPU.
See docs/training/megatron-fsdp.md ("The CPU story") for what this proves and what it does not.
"""

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist

from megatron_bridge.training.callbacks import Callback


_INSTALLED = False
_ORIGINALS: dict[str, Any] = {}


class _FakeEvent:
    """A CUDA event on CPU: already complete."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, *args: Any, **kwargs: Any) -> None:
        """No-op."""

    def wait(self, *args: Any, **kwargs: Any) -> None:
        """No-op."""

    def synchronize(self) -> None:
        """No-op."""

    def query(self) -> bool:
        """Always complete."""
        return True


class _FakeStream:
    """A CUDA stream on CPU: everything runs in program order, so every wait is a no-op."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, *args: Any) -> None:
        """No-op."""

    def wait_event(self, *args: Any) -> None:
        """No-op."""

    def record_event(self, event: Any = None) -> _FakeEvent:
        """A completed event."""
        return event or _FakeEvent()

    def synchronize(self) -> None:
        """No-op."""

    def query(self) -> bool:
        """Always idle."""
        return True

    def __enter__(self) -> "_FakeStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class _DoneWork:
    """A completed collective handle (``Work``)."""

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        """Already done."""
        return True

    def is_completed(self) -> bool:
        """Always."""
        return True

    def is_success(self) -> bool:
        """Always."""
        return True

    def get_future(self) -> torch.futures.Future:
        """A completed future."""
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(None)
        return future


_STREAM = _FakeStream()


def _synchronous(name: str, out_arg: int | None) -> Any:
    original = getattr(dist, name)
    _ORIGINALS[name] = original

    def collective(*args: Any, **kwargs: Any) -> Any:
        wants_async = bool(kwargs.pop("async_op", False))
        op = kwargs.get("op")
        average = op is not None and op == dist.ReduceOp.AVG
        if average:
            kwargs["op"] = dist.ReduceOp.SUM
        original(*args, async_op=False, **kwargs)
        if average and out_arg is not None:
            out = args[out_arg] if len(args) > out_arg else kwargs.get("tensor", kwargs.get("output"))
            out.div_(dist.get_world_size(kwargs.get("group")))
        return _DoneWork() if wants_async else None

    collective.__name__ = name
    collective.__wrapped__ = original  # type: ignore[attr-defined]
    return collective


@contextmanager
def _coalescing_manager(*args: Any, **kwargs: Any) -> Iterator[_DoneWork]:
    yield _DoneWork()


def _gradient_reduce_preprocessing(grad_data: torch.Tensor, scaling_factor: float | None, ddp_config: Any) -> Any:
    """megatron-fsdp's pre-scaling without the NCCL-only PREMUL_SUM: scale, then SUM (or AVG)."""
    if scaling_factor is None:
        return dist.ReduceOp.SUM
    if ddp_config.average_in_collective:
        return dist.ReduceOp.AVG
    grad_data.mul_(scaling_factor)
    return dist.ReduceOp.SUM


def install() -> None:
    """Apply every patch of the module docstring in this process (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    if torch.cuda.is_available():
        raise RuntimeError("the Megatron FSDP CPU harness replaces CUDA calls: never install it with CUDA present")
    import megatron_fsdp.param_and_grad_buffer as pgb

    from megatron_bridge.distributed import megatron_fsdp_compat

    cuda = torch.cuda
    cuda.Stream = _FakeStream  # type: ignore[misc,assignment]
    cuda.Event = _FakeEvent  # type: ignore[misc,assignment]
    cuda.stream = lambda stream=None: nullcontext()  # type: ignore[assignment]
    cuda.current_stream = lambda device=None: _STREAM  # type: ignore[assignment]
    cuda.current_device = lambda: 0  # type: ignore[assignment]
    cuda.synchronize = lambda device=None: None  # type: ignore[assignment]
    cuda.empty_cache = lambda: None  # type: ignore[assignment]
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign,assignment]
    dist.all_reduce = _synchronous("all_reduce", 0)
    dist.all_gather_into_tensor = _synchronous("all_gather_into_tensor", None)
    dist.reduce_scatter_tensor = _synchronous("reduce_scatter_tensor", 0)
    dist.all_gather = _synchronous("all_gather", None)
    dist.broadcast = _synchronous("broadcast", None)
    pgb._coalescing_manager = _coalescing_manager
    pgb.gradient_reduce_preprocessing = _gradient_reduce_preprocessing
    megatron_fsdp_compat.require_cuda = lambda device: None
    _INSTALLED = True


def is_installed() -> bool:
    """True once :func:`install` ran in this process."""
    return _INSTALLED


def full_weights(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Full CPU tensors of a Megatron FSDP model state dict (``backend.model_state_dict()["model"]``); collective.

    megatron-fsdp's DTensors are sharded unevenly (flat buckets), so ``DTensor.full_tensor()`` does not apply: each
    rank sends its shard with the offsets megatron-fsdp recorded for DCP (``__create_chunk_list__``).
    """
    from torch.distributed.tensor import DTensor

    full: dict[str, torch.Tensor] = {}
    for key in sorted(state):
        value = state[key]
        if not isinstance(value, DTensor):
            full[key] = value.detach().to("cpu", copy=True)
            continue
        local = value._local_tensor
        # megatron-fsdp's uneven shards carry their offsets; an even DTensor (no_shard: replicated over "dp_cp",
        # maybe split over "tp") has DTensor's own
        chunks = (local.__create_chunk_list__() if hasattr(local, "__create_chunk_list__")
                  else value.__create_chunk_list__())
        offsets = tuple(chunks[0].offsets) if chunks else (0,) * value.ndim
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, (offsets, local.detach().to("cpu", copy=True)))
        tensor = torch.zeros(value.shape, dtype=value.dtype)
        for part_offsets, part in parts:
            if part.numel():
                tensor[tuple(slice(o, o + n) for o, n in zip(part_offsets, part.shape))] = part
        full[key] = tensor
    return full


class MegatronFullWeights(Callback):
    """A training callback: full weights of the Megatron FSDP model at the end of training (collective; every rank
    keeps them)."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    def on_train_end(self, ctx: Any) -> None:
        """Gather the full weights (:func:`full_weights`)."""
        self.weights = full_weights(ctx.backend.model_state_dict()["model"])
