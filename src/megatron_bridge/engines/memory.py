"""What an engine tells the memory estimate (:mod:`megatron_bridge.perf.memory`) about the state it allocates.

Pure arithmetic (no torch): the estimate runs before any process starts. The native engine's formulas live in
:mod:`megatron_bridge.perf.memory`; an engine that allocates differently provides an :class:`EngineMemory`
(:func:`megatron_bridge.engines.factory.engine_memory` returns the config's), which replaces them where
:meth:`EngineMemory.counts_state` says so.
"""

from typing import TYPE_CHECKING, Protocol


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of each ``model.params_dtype`` / compute dtype."""
FP32 = DTYPE_BYTES["float32"]


class MemoryLayout(Protocol):
    """The parts of the estimate's parallel layout (:class:`megatron_bridge.perf.layout.Layout`) an engine reads."""

    backend: str
    """The data-parallel backend: "ddp", "fsdp2" or "megatron_fsdp"."""
    dp: int
    """Data-parallel size."""
    shard_size: int
    """Ranks the sharded state is split over (dp × cp)."""


class EngineMemory(Protocol):
    """An engine's own memory model: bytes per parameter, buffers, step temporaries and the notes that say so."""

    def counts_state(self, cfg: "ConfigContainer", layout: MemoryLayout) -> bool:
        """True where :meth:`bytes_per_param` and :meth:`step_temporary_bytes` replace the native formulas."""
        ...

    def has_gradient_buffer(self, cfg: "ConfigContainer", layout: MemoryLayout) -> bool:
        """True where a contiguous gradient buffer replaces DDP's buckets and autocast copies (its buckets are views
        of the buffer, the weights already in the compute dtype)."""
        ...

    def bytes_per_param(self, cfg: "ConfigContainer", layout: MemoryLayout) -> tuple[int, int, int]:
        """(parameter, gradient, optimizer-state) bytes per parameter, before sharding."""
        ...

    def step_temporary_bytes(self, cfg: "ConfigContainer", layout: MemoryLayout, optimizer_params: int) -> int:
        """Temporaries of one optimizer step over ``optimizer_params`` (local) parameters."""
        ...

    def bucket_bytes(self, cfg: "ConfigContainer", layout: MemoryLayout, rank_params: int) -> int:
        """The largest gradient bucket (a view of the gradient buffer) where :meth:`has_gradient_buffer`."""
        ...

    def notes(self, cfg: "ConfigContainer", layout: MemoryLayout) -> list[str]:
        """What the estimate assumes for this engine."""
        ...


def optimizer_moments(cfg: "ConfigContainer") -> int:
    """Buffers per parameter the optimizer keeps: Adam's two moments, SGD's momentum (or none)."""
    o = cfg.optimizer
    return 2 if o.optimizer == "adam" else (1 if o.sgd_momentum else 0)


def fp32_optimizer_bytes(cfg: "ConfigContainer") -> int:
    """Optimizer bytes per parameter of megatron-core's optimizer and megatron-fsdp's main-weight buffers: fp32
    moments, plus fp32 main weights when the parameters are 16-bit."""
    main_params = FP32 if DTYPE_BYTES[cfg.model.params_dtype] < FP32 else 0
    return optimizer_moments(cfg) * FP32 + main_params
