"""Megatron FSDP around megatron-core chunks (``model.engine="megatron_core"`` with ``dist.use_megatron_fsdp``):
megatron-core's adapter ``megatron.core.distributed.fsdp.FullyShardedDataParallel`` (megatron-fsdp 0.6.1, vendored by
megatron-core) around each ``GPTModel``, as Megatron-Bridge's ``_ddp_wrap`` does, and megatron-core's optimizer over
it (``get_megatron_optimizer`` takes its Megatron FSDP branch: the optimizer steps on megatron-fsdp's sharded main
weights and all-gathers the updated parameters itself).

``cfg.ddp`` → megatron-core's ``DistributedDataParallelConfig`` (:func:`megatron_fsdp_ddp_config`):

==========================================  ================================================================
``cfg.ddp`` (Megatron-Bridge names)          megatron-core (FSDP adapter)
==========================================  ================================================================
use_megatron_fsdp                           ``use_megatron_fsdp=True`` (kept equal to dist.use_megatron_fsdp)
data_parallel_sharding_strategy             ``data_parallel_sharding_strategy`` (no_shard / optim /
                                            optim_grads / optim_grads_params)
overlap_grad_reduce, overlap_param_gather   the same fields
use_distributed_optimizer                   the same (always True: adjustment megatron_fsdp_distributed_optimizer)
check_for_nan_in_grad                       the same (megatron-fsdp checks each gradient bucket before reducing)
average_in_collective                       the same (set False by adjustment megatron_fsdp_average_in_collective)
bucket_size                                 ``bucket_size`` and ``suggested_communication_unit_size``
grad_reduce_in_fp32                         ``grad_reduce_in_fp32`` and ``megatron_fsdp_main_grads_dtype=
                                            torch.float32`` (else None: the parameters' dtype)
preserve_fp32_weights, or a bf16/fp16       ``megatron_fsdp_main_params_dtype=torch.float32`` (else None: the
preset (Megatron-Bridge's bf16_mixed)       compute weights are the main weights); bf16/fp16 chunks arrive in
                                            megatron-core's ``Float16Module`` (engines/megatron_core/precision.py)
fp8_param_gather, fp4_param_gather, ...     the preset's fields (``ddp_precision``)
nccl_ub, fsdp_double_buffer,                the same fields
keep_fp8_transpose_cache
disable_bucketing                           the adapter's ``disable_bucketing`` argument
megatron_fsdp_unit_modules                  the adapter's ``fsdp_unit_modules`` (class paths imported); None: the
                                            adapter's default (``TransformerLayer`` units with
                                            optim_grads_params, none otherwise)
==========================================  ================================================================

What this backend cannot do is refused by ``validate()`` (rule ``megatron_core_fsdp``, config/rules_engine.py).
The loop drives it through :class:`~megatron_bridge.engines.megatron_core.ddp.MegatronCoreDDPBackend`'s methods, which
the adapter shares with megatron-core DDP (``no_sync``, ``finish_grad_sync``, ``zero_grad_buffer``, the optimizer's
own clipping step).
"""

import importlib
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from megatron_bridge.engines.megatron_core.ddp import MegatronCoreDDPBackend
from megatron_bridge.errors import MegatronBridgeError
from megatron_bridge.utils.logging import get_logger, log_rank_0


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

logger = get_logger(__name__)




def megatron_fsdp_ddp_config(cfg: "ConfigContainer") -> Any:
    """megatron-core's ``DistributedDataParallelConfig`` for its Megatron FSDP adapter from ``cfg.ddp`` (the table
    in the module docstring)."""
    from megatron.core.distributed import DistributedDataParallelConfig

    from megatron_bridge.engines.megatron_core.precision import ddp_precision

    d = cfg.ddp
    fp32 = torch.float32
    precision = ddp_precision(cfg)  # grad_reduce_in_fp32 and the preset's FP8/FP4 gather fields
    return DistributedDataParallelConfig(
        **precision,
        use_megatron_fsdp=True,
        data_parallel_sharding_strategy=d.data_parallel_sharding_strategy,
        overlap_grad_reduce=d.overlap_grad_reduce,
        overlap_param_gather=d.overlap_param_gather,
        use_distributed_optimizer=d.use_distributed_optimizer,
        check_for_nan_in_grad=d.check_for_nan_in_grad,
        average_in_collective=d.average_in_collective,
        bucket_size=d.bucket_size,
        suggested_communication_unit_size=d.bucket_size,
        megatron_fsdp_main_grads_dtype=fp32 if d.grad_reduce_in_fp32 else None,
        megatron_fsdp_main_params_dtype=fp32 if d.preserve_fp32_weights or _low_precision(cfg) else None,
        nccl_ub=d.nccl_ub,
        fsdp_double_buffer=d.fsdp_double_buffer,
        keep_fp8_transpose_cache=d.keep_fp8_transpose_cache,
    )


def _low_precision(cfg: "ConfigContainer") -> bool:
    """The model computes in bf16/fp16 (a preset): Megatron-Bridge's ``bf16_mixed`` keeps fp32 main weights
    (its ``megatron_fsdp_main_params_dtype`` defaults to float32)."""
    mp = cfg.mixed_precision_config
    return mp is not None and bool(mp.bf16 or mp.fp16)


def unit_module_classes(class_paths: list[str] | None, model: nn.Module) -> list[type[nn.Module]] | None:
    """``ddp.megatron_fsdp_unit_modules`` as classes (None keeps the adapter's default units).

    Raises:
        MegatronBridgeError: a path that does not import or is not a module class, or a class no submodule of
            ``model`` has (an empty list is rule megatron_fsdp_unit_modules, which ``wrap()`` enforces).
    """
    if class_paths is None:
        return None
    classes = []  # an empty list or a short path: rule megatron_fsdp_unit_modules (wrap() enforces it)
    for path in class_paths:
        module_path, _, name = path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_path), name) if module_path else None
        except (ImportError, AttributeError):
            cls = None
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise MegatronBridgeError(
                f"ddp.megatron_fsdp_unit_modules: {path!r} is not an importable torch.nn.Module class path; use e.g. "
                "'megatron.core.transformer.transformer_layer.TransformerLayer', or set None")
        if not any(isinstance(m, cls) for m in model.modules()):
            raise MegatronBridgeError(
                f"ddp.megatron_fsdp_unit_modules: no submodule of {type(model).__name__} is a {path}; list the "
                "model's block classes (megatron-core: TransformerLayer), or set None")
        classes.append(cls)
    return classes


class MegatronCoreFSDPBackend(MegatronCoreDDPBackend):
    """megatron-core's Megatron FSDP adapter (``FullyShardedDataParallel``) around each ``GPTModel`` chunk."""

    name = "mcore_megatron_fsdp"

    def wrap(self, model_chunks: list[nn.Module]) -> list[nn.Module]:
        """Wrap every chunk (only the first has communication buckets, as for megatron-core DDP)."""
        from megatron.core.distributed.fsdp import FullyShardedDataParallel

        from megatron_bridge.config.adjustments import apply_adjustment
        from megatron_bridge.config.rule_set import enforce

        for adjustment in ("megatron_fsdp_flags", "megatron_fsdp_distributed_optimizer",
                           "megatron_fsdp_average_in_collective"):
            apply_adjustment(self.cfg, adjustment)  # as validate() does (logged once), also without validate()
        enforce(self.cfg, "megatron_core_fsdp", "megatron_fsdp_unit_modules")
        d = self.cfg.ddp
        config = megatron_fsdp_ddp_config(self.cfg)
        self.chunks = [
            FullyShardedDataParallel(
                chunk.config, config, chunk,
                fsdp_unit_modules=unit_module_classes(d.megatron_fsdp_unit_modules, chunk),
                disable_bucketing=d.disable_bucketing or i > 0,
                device=self.device,
            )
            for i, chunk in enumerate(model_chunks)
        ]
        log_rank_0(logger, "megatron-core Megatron FSDP: %s over %d data-parallel rank(s), units %s",
                   d.data_parallel_sharding_strategy, self._dp_size(),
                   [c.__name__ for c in self.chunks[0].fsdp_unit_modules])
        return self.chunks

    def grad_sync_context(self, *, is_last_microbatch: bool) -> AbstractContextManager:
        """Gradients are reduced in the last micro-batch's backward only with ``overlap_grad_reduce`` (which
        megatron-fsdp turns on itself for optim_grads and optim_grads_params, whose backward reduce-scatters every
        micro-batch); without it, once in :meth:`finish_grad_sync` — megatron-fsdp's ``finish_grad_sync`` then
        reduces the buffers again, which after a reduction in the backward would sum the optim (ZeRO-1) gradients
        twice (measured: per-step losses off by 3e-4 from the third step)."""
        return _last_microbatch([chunk.module for chunk in self.chunks], is_last_microbatch)

    def unwrap(self, chunk: nn.Module) -> nn.Module:
        """The ``GPTModel`` inside the adapter, megatron-fsdp's ``MegatronFSDP`` and, with bf16/fp16, its
        ``Float16Module``."""
        from megatron_bridge.engines.megatron_core.precision import unwrap_float16

        inner = getattr(chunk, "module", chunk)
        return unwrap_float16(getattr(inner, "module", inner))

    @staticmethod
    def _dp_size() -> int:
        from megatron.core import parallel_state

        return parallel_state.get_data_parallel_world_size(with_context_parallel=True)


@contextmanager
def _last_microbatch(fsdp_modules: list[Any], is_last: bool) -> Iterator[None]:
    """megatron-fsdp's ``is_last_microbatch`` flag (what its ``no_sync`` clears) for the coming backward."""
    for module in fsdp_modules:
        module.is_last_microbatch = is_last and module.ddp_config.overlap_grad_reduce
    yield
    for module in fsdp_modules:
        module.is_last_microbatch = True
