"""PyTorch FSDP2 around megatron-core chunks (``model.engine="megatron_core"`` with ``dist.use_torch_fsdp2``):
megatron-core's ``TorchFullyShardedDataParallel`` around each ``GPTModel``, as Megatron-Bridge's ``_ddp_wrap`` does,
with megatron-core's optimizer over it — the non-distributed one, as Megatron-LM requires for FSDP2 (FSDP2 already
shards parameters, gradients and optimizer state over the data-parallel ranks; the optimizer steps on the local
DTensor shards and megatron-core's gradient clipping sums the shards' norms over the data-parallel group).

``fully_shard`` wraps each ``TransformerLayer``, the embedding and the rotary embedding (megatron-core's default
units; with the transformer-engine spec also the output layer), then the root, over megatron-core's data-parallel
group (with context parallelism). Options:

=====================================  =======================================================================
config                                 effect
=====================================  =======================================================================
fsdp2.reshard_after_forward            ``TorchFullyShardedDataParallelConfig.reshard_after_forward`` (None:
                                       megatron-core's default, True)
fsdp2.defer_fsdp_grad_sync             gradients are reduce-scattered only on a step's last micro-batch
                                       (``set_requires_gradient_sync``); False: after every micro-batch
fsdp2.enable_fsdp2_prefetch,           explicit forward/backward prefetch chains between the layers (when they
fsdp2.fsdp2_{forward,backward}_        reshard after forward)
prefetch_depth
optimizer.*                            megatron-core's optimizer (``use_distributed_optimizer`` is refused)
=====================================  =======================================================================

The other ``fsdp2`` options belong to the native engine's FSDP2 backend; ``validate()`` refuses the ones that would
change something here (rule ``megatron_core_fsdp``), as it refuses tied embeddings (the embedding and the output layer
are sharded apart; Megatron-LM requires untied ones too), the distributed optimizer, fp16 and pipeline parallelism
(Megatron-LM refuses all three with ``--use-torch-fsdp2``).

**bf16** (``mixed_precision="bf16_mixed"``), as Megatron-LM runs it: megatron-core's ``Float16Module`` casts the
weights to bf16 before sharding, so FSDP2 all-gathers and reduce-scatters bf16 (megatron-core's wrapper passes no
``MixedPrecisionPolicy``: ``ddp.grad_reduce_in_fp32`` has no effect here, logged), and megatron-core's
``Float16OptimizerWithFloat16Params`` keeps fp32 main parameters as DTensor shards and steps on them.

**Checkpoints**: megatron-core ``torch_dist`` folders in Megatron-Bridge's layout, the same global tensors as
megatron-core DDP writes (:mod:`megatron_bridge.checkpoint.mcore_torch_fsdp2`), so they resume under either wrapper:
in bf16 the bf16 weight shards under ``model`` and the fp32 main parameters and Adam state (``fp32_param``,
``exp_avg``, ``exp_avg_sq``) under ``optimizer``; with ``checkpoint.async_save`` through megatron-core's async save
(:class:`megatron_bridge.checkpoint.mcore_checkpoint.AsyncMcoreSaves`) as with DDP; ``checkpoint.pretrained_checkpoint``
loads the weights into the shards and the main parameters from them (``reload_model_params``).
"""

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from torch import nn

from megatron_bridge.distributed.fsdp2_sharding import set_prefetch_chains
from megatron_bridge.engines.megatron_core.ddp import MegatronCoreDDPBackend
from megatron_bridge.utils.logging import get_logger, log_rank_0


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

logger = get_logger(__name__)


def torch_fsdp2_ddp_config(cfg: "ConfigContainer") -> Any:
    """megatron-core's ``TorchFullyShardedDataParallelConfig`` from ``cfg.fsdp2`` and ``cfg.ddp``."""
    from megatron.core.distributed import TorchFullyShardedDataParallelConfig

    reshard = cfg.fsdp2.reshard_after_forward
    return TorchFullyShardedDataParallelConfig(
        reshard_after_forward=True if reshard is None else reshard,
        grad_reduce_in_fp32=cfg.ddp.grad_reduce_in_fp32,
        use_distributed_optimizer=False,
    )


def units_to_wrap(transformer_impl: str) -> set[type[nn.Module]]:
    """megatron-core's default FSDP2 units: transformer layers, the embedding and the rotary embedding, plus the
    output layer (``ColumnParallelLinear``) with the transformer-engine spec only (with the local spec the layers'
    own linear layers are ``ColumnParallelLinear`` too)."""
    from megatron.core import tensor_parallel
    from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.transformer.transformer_layer import TransformerLayer

    units: set[type[nn.Module]] = {TransformerLayer, LanguageModelEmbedding, RotaryEmbedding}
    if transformer_impl == "transformer_engine":
        units.add(tensor_parallel.ColumnParallelLinear)
    return units


class MegatronCoreFSDP2Backend(MegatronCoreDDPBackend):
    """megatron-core's ``TorchFullyShardedDataParallel`` (PyTorch FSDP2) around each ``GPTModel`` chunk."""

    name = "mcore_fsdp2"

    def wrap(self, model_chunks: list[nn.Module]) -> list[nn.Module]:
        """Shard every chunk (``fully_shard`` per unit, then the root) and set the prefetch chains."""
        from megatron.core.distributed import TorchFullyShardedDataParallel
        from megatron.core.transformer.transformer_layer import TransformerLayer

        from megatron_bridge.config.rule_set import enforce

        enforce(self.cfg, "megatron_core_fsdp")
        config = torch_fsdp2_ddp_config(self.cfg)
        units = units_to_wrap(self.cfg.model.transformer_impl)
        self.chunks = [TorchFullyShardedDataParallel(chunk.config, config, chunk, sub_modules_to_wrap=units)
                       for chunk in model_chunks]
        f = self.cfg.fsdp2
        if f.enable_fsdp2_prefetch and config.reshard_after_forward is not False:
            for chunk in self.chunks:
                layers = [m for m in chunk.module.modules() if isinstance(m, TransformerLayer)]
                set_prefetch_chains(layers, f.fsdp2_forward_prefetch_depth, f.fsdp2_backward_prefetch_depth)
        log_rank_0(logger, "megatron-core FSDP2: %d unit(s) per chunk (%s), reshard_after_forward=%s",
                   sum(1 for m in self.chunks[0].module.modules() if isinstance(m, tuple(units))),
                   sorted(c.__name__ for c in units), config.reshard_after_forward)
        if self.cfg.ddp.grad_reduce_in_fp32 and (self.cfg.optimizer.bf16 or self.cfg.optimizer.fp16):
            log_rank_0(logger, "ddp.grad_reduce_in_fp32=True has no effect with dist.use_torch_fsdp2 on "
                       "model.engine='megatron_core': megatron-core's FSDP2 wrapper takes no mixed-precision policy, "
                       "so gradients are reduce-scattered in the bf16 weights' dtype (as in Megatron-LM); "
                       "megatron-core's optimizer still steps fp32 main weights", level=logging.WARNING)
        return self.chunks

    def grad_sync_context(self, *, is_last_microbatch: bool) -> AbstractContextManager:
        """With ``fsdp2.defer_fsdp_grad_sync``, reduce-scatter only during the last micro-batch's backward
        (megatron-core's wrapper has no ``no_sync``: FSDP2's ``set_requires_gradient_sync`` on the root)."""
        sync = is_last_microbatch or not self.cfg.fsdp2.defer_fsdp_grad_sync
        return _requires_gradient_sync([chunk.module for chunk in self.chunks], sync)


@contextmanager
def _requires_gradient_sync(roots: list[Any], sync: bool) -> Iterator[None]:
    for root in roots:
        root.set_requires_gradient_sync(sync, recurse=True)
    yield
