"""State bytes of the megatron-core engine (``model.engine="megatron_core"``) with megatron-core DDP.

Pure arithmetic (no torch), used by :mod:`megatron_bridge.perf.memory` where the layout's backend is DDP and the engine
is megatron-core's (:class:`~megatron_bridge.distributed.mcore_ddp.MegatronCoreDDPBackend`). Per parameter, as
megatron-core 0.19 allocates:

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

Not counted: the distributed optimizer's buffer padding (each parameter starts at a multiple of 64 elements, each bucket
ends at a multiple of lcm(dp, 128)): at most 63 elements per tensor, under 0.1% on the tiny recipe; Adam's per-tensor
``step`` scalars. Measured against megatron-core on CPU by tests/functional_tests/perf/test_mcore_memory_estimate.py.
"""

from typing import TYPE_CHECKING

from megatron_bridge.perf.layout import DTYPE_BYTES, Layout


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

FP32 = 4


def is_mcore_ddp(cfg: "ConfigContainer", layout: Layout) -> bool:
    """True for the megatron-core engine under megatron-core DDP (neither of its FSDP wrappers)."""
    return getattr(cfg.model, "engine", "native") == "megatron_core" and layout.backend == "ddp"


def is_mcore_fsdp(cfg: "ConfigContainer", layout: Layout) -> bool:
    """True for the megatron-core engine under its Megatron FSDP adapter or FSDP2 wrapper."""
    return getattr(cfg.model, "engine", "native") == "megatron_core" and layout.backend != "ddp"


def mcore_bytes_per_param(cfg: "ConfigContainer") -> tuple[int, int, int]:
    """(parameter, gradient, optimizer-state) bytes per parameter of megatron-core DDP + ``get_megatron_optimizer``,
    before sharding."""
    pbytes = DTYPE_BYTES[cfg.model.params_dtype]
    grad = FP32 if cfg.ddp.grad_reduce_in_fp32 else pbytes
    o = cfg.optimizer
    moments = 2 if o.optimizer == "adam" else (1 if o.sgd_momentum else 0)
    main_params = FP32 if pbytes < FP32 else 0
    return pbytes, grad, moments * FP32 + main_params


def mcore_step_temporary_bytes(cfg: "ConfigContainer", optimizer_params: int) -> int:
    """The optimizer step's fp32 copy of 16-bit main gradients (``main_grad.float()``) for ``optimizer_params``
    parameters (the local shard with the distributed optimizer); 0 when the gradient buffer is fp32."""
    return 0 if mcore_bytes_per_param(cfg)[1] == FP32 else FP32 * optimizer_params


def mcore_bucket_bytes(cfg: "ConfigContainer", layout: Layout, rank_params: int) -> int:
    """The largest gradient bucket: one bucket of everything unless ``ddp.overlap_grad_reduce``, then
    ``ddp.bucket_size`` elements (megatron-core's default: max(40M, 1M × dp))."""
    elements = rank_params
    if cfg.ddp.overlap_grad_reduce:
        elements = min(rank_params, cfg.ddp.bucket_size or max(40_000_000, 1_000_000 * layout.dp))
    return elements * mcore_bytes_per_param(cfg)[1]


def mcore_notes(cfg: "ConfigContainer", layout: Layout) -> list[str]:
    """What the estimate assumes for the megatron-core engine."""
    if is_mcore_fsdp(cfg, layout):
        return ["model.engine=megatron_core with a megatron-core FSDP wrapper: state and buffers are counted with the "
                "native engine's FSDP formulas (not modelled for megatron-core's wrappers yet); activations as the "
                "native engine's blocks"]
    p, g, o = mcore_bytes_per_param(cfg)
    sharded = (f"sharded over {layout.shard_size} data-parallel rank(s) (distributed optimizer)"
               if cfg.optimizer.use_distributed_optimizer else "replicated")
    return [f"model.engine=megatron_core with megatron-core DDP: weights {p} B/param ({cfg.model.params_dtype}), "
            f"contiguous main_grad buffer {g} B/param, optimizer {o} B/param "
            f"({'fp32 main parameters + ' if p < FP32 else ''}fp32 moments) {sharded}; buffer padding not counted; "
            "activations counted as the native engine's blocks"]
