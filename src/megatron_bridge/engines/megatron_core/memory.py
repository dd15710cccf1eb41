"""The memory model of the megatron-core engine (``model.engine="megatron_core"``): its state bytes under megatron-core
DDP (:class:`~megatron_bridge.engines.megatron_core.ddp.MegatronCoreDDPBackend`) and its FSDP2 wrapper
(:mod:`megatron_bridge.engines.megatron_core.fsdp2`).

Pure arithmetic (no torch): :class:`MegatronCoreMemory` is this engine's
:class:`~megatron_bridge.engines.memory.EngineMemory`, which :mod:`megatron_bridge.perf.memory` asks through
:func:`megatron_bridge.engines.factory.engine_memory`. Per parameter, as megatron-core 0.19 allocates under DDP:

* **parameters**: ``model.params_dtype`` bytes (C). On this engine it is the compute dtype (bf16/fp16 under the
  ``bf16_mixed`` / ``fp16_mixed`` presets: ``Float16Module`` casts the weights in place; fp32 otherwise). With the
  distributed optimizer the weights live in DDP's contiguous ``param_data`` buffer (same bytes).
* **gradients**: DDP's contiguous gradient buffer (``grad_data``; every ``param.main_grad`` is a view of it), fp32
  with ``ddp.grad_reduce_in_fp32``, else the parameter dtype (``param_and_grad_buffer.py``: ``grad_dtype``). No
  ``param.grad`` stays allocated, so there are no separate DDP buckets.
* **optimizer** (``get_megatron_optimizer``): with bf16/fp16 weights fp32 main parameters (4) plus fp32 Adam moments
  (8): 12 bytes (``Float16OptimizerWithFloat16Params`` / ``DistributedOptimizer``); with fp32 weights only the moments
  (8; the optimizer steps on the weights themselves). SGD with momentum: one fp32 buffer instead of two. With
  ``optimizer.use_distributed_optimizer`` the optimizer state is sharded over dp × cp (experts over the
  expert-data-parallel group); parameters and gradients are not.
* **buffers**: none beyond the state (no autocast copies: the weights already are in the compute dtype).
* **optimizer step temporaries**: the fp32 copy of the main gradients the step makes when the gradient buffer is
  16-bit (``main_grad.float()``), one per optimizer parameter; Adam's own temporaries are not counted (on GPUs
  megatron-core steps with transformer-engine's or apex's fused Adam, which works in place).

Under the **FSDP2 wrapper** (``TorchFullyShardedDataParallel``, no ``MixedPrecisionPolicy``) the same optimizer
(``Float16OptimizerWithFloat16Params`` / ``FP32Optimizer`` on the local shards), gradients in the weights' dtype
(``ddp.grad_reduce_in_fp32`` has no effect there), all three sharded over dp × cp; its buffers keep the native FSDP2
formulas. The **Megatron FSDP adapter** keeps :mod:`megatron_bridge.perf.memory`'s Megatron FSDP formulas: they are
megatron-fsdp's own, which the adapter uses (measured within 0.6%: its buffer padding).

Not counted: the distributed optimizer's buffer padding (each parameter starts at a multiple of 64 elements, each bucket
ends at a multiple of lcm(dp, 128)): at most 63 elements per tensor, under 0.1% on the tiny recipe; Adam's per-tensor
``step`` scalars. Measured against megatron-core on CPU by tests/functional_tests/perf/test_mcore_memory_estimate.py.
"""

from typing import TYPE_CHECKING

from megatron_bridge.engines.memory import DTYPE_BYTES, FP32, MemoryLayout, fp32_optimizer_bytes


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer


class MegatronCoreMemory:
    """:class:`~megatron_bridge.engines.memory.EngineMemory` of the megatron-core engine (the module docstring says
    what it counts)."""

    def counts_state(self, cfg: "ConfigContainer", layout: MemoryLayout) -> bool:
        """Under megatron-core DDP or its FSDP2 wrapper (its Megatron FSDP adapter keeps megatron-fsdp's
        formulas)."""
        return layout.backend in ("ddp", "fsdp2")

    def has_gradient_buffer(self, cfg: "ConfigContainer", layout: MemoryLayout) -> bool:
        """Under megatron-core DDP (neither of its FSDP wrappers)."""
        return layout.backend == "ddp"

    def bytes_per_param(self, cfg: "ConfigContainer", layout: MemoryLayout) -> tuple[int, int, int]:
        """(parameter, gradient, optimizer-state) bytes per parameter of megatron-core DDP or the FSDP2 wrapper with
        ``get_megatron_optimizer``, before sharding."""
        pbytes = DTYPE_BYTES[cfg.model.params_dtype]
        grad = FP32 if cfg.ddp.grad_reduce_in_fp32 and layout.backend == "ddp" else pbytes
        return pbytes, grad, fp32_optimizer_bytes(cfg)

    def step_temporary_bytes(self, cfg: "ConfigContainer", layout: MemoryLayout, optimizer_params: int) -> int:
        """The optimizer step's fp32 copy of 16-bit gradients (``main_grad.float()`` / ``grad.float()``) for
        ``optimizer_params`` parameters (the local shard with the distributed optimizer or FSDP2); 0 when they are
        fp32."""
        return 0 if self.bytes_per_param(cfg, layout)[1] == FP32 else FP32 * optimizer_params

    def bucket_bytes(self, cfg: "ConfigContainer", layout: MemoryLayout, rank_params: int) -> int:
        """The largest gradient bucket of megatron-core DDP: one bucket of everything unless
        ``ddp.overlap_grad_reduce``, then ``ddp.bucket_size`` elements (megatron-core's default: max(40M, 1M × dp))."""
        elements = rank_params
        if cfg.ddp.overlap_grad_reduce:
            elements = min(rank_params, cfg.ddp.bucket_size or max(40_000_000, 1_000_000 * layout.dp))
        return elements * self.bytes_per_param(cfg, layout)[1]

    def notes(self, cfg: "ConfigContainer", layout: MemoryLayout) -> list[str]:
        """What the estimate assumes for the megatron-core engine."""
        if layout.backend == "megatron_fsdp":
            return ["model.engine=megatron_core with the Megatron FSDP adapter: megatron-fsdp's formulas (as the "
                    "native engine's Megatron FSDP; buffer padding not counted); activations counted as the native "
                    "engine's blocks"]
        p, g, o = self.bytes_per_param(cfg, layout)
        main = "fp32 main parameters + " if p < FP32 else ""
        if layout.backend == "fsdp2":
            return [f"model.engine=megatron_core with the FSDP2 wrapper: weights {p} B/param "
                    f"({cfg.model.params_dtype}), gradients {g} B/param (no MixedPrecisionPolicy), optimizer {o} "
                    f"B/param ({main}fp32 moments), all sharded over {layout.shard_size} rank(s); buffers as the "
                    "native FSDP2 backend's; activations counted as the native engine's blocks"]
        sharded = (f"sharded over {layout.shard_size} data-parallel rank(s) (distributed optimizer)"
                   if cfg.optimizer.use_distributed_optimizer else "replicated")
        return [f"model.engine=megatron_core with megatron-core DDP: weights {p} B/param ({cfg.model.params_dtype}), "
                f"contiguous main_grad buffer {g} B/param, optimizer {o} B/param ({main}fp32 moments) {sharded}; "
                "buffer padding not counted; activations counted as the native engine's blocks"]
