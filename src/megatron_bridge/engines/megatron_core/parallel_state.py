"""megatron-core's parallel state from this library's config: process groups, model-parallel RNG, teardown.

megatron-core's default rank order ``"tp-cp-ep-dp-pp"`` (innermost first) is the layout of
:func:`megatron_bridge.distributed.init.build_device_mesh` (``("pp", "dp", "cp", "tp")`` outermost first), so a rank
holds the same data-parallel, tensor-parallel and pipeline indices under both engines and reads the same samples.
"""

from typing import TYPE_CHECKING

import torch

from megatron_bridge.config.rules_moe import expert_tensor_parallel_size
from megatron_bridge.errors import MegatronBridgeError
from megatron_bridge.utils.logging import get_logger, log_rank_0


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

logger = get_logger(__name__)

MCORE_ORDER = "tp-cp-ep-dp-pp"
"""megatron-core's rank order (innermost first), the order of this library's device mesh."""


class MegatronCoreNeedsCudaError(MegatronBridgeError, RuntimeError):
    """model.engine='megatron_core' on a machine without CUDA (megatron-core hard-codes CUDA calls)."""


def require_cuda(device: torch.device) -> None:
    """Raise :class:`MegatronCoreNeedsCudaError` unless ``device`` is a CUDA device.

    megatron-core allocates on ``torch.cuda.current_device()``, seeds CUDA generators and asserts CUDA tensor types
    (docs/training/engines.md), so on CPU it would stop somewhere inside its code; this names the problem first. The
    CPU tests replace this check together with those calls (tests/functional_tests/mcore_cpu_harness.py).
    """
    if device.type != "cuda":
        raise MegatronCoreNeedsCudaError(
            f"model.engine='megatron_core' needs a CUDA device, but this rank computes on {device}: megatron-core "
            "hard-codes CUDA calls. Run on GPUs (dist.distributed_backend='nccl' or None), or set "
            "model.engine='native' (runs on CPU and GPU)."
        )


Layout = tuple[int, int, int, int | None, int, int]
"""Sizes of megatron-core's parallel state: (TP, PP, CP, VP, EP, ETP); VP None without virtual pipeline stages."""


def layout(cfg: "ConfigContainer") -> Layout:
    """The (TP, PP, CP, VP, EP, ETP) sizes ``cfg.model`` asks megatron-core's parallel state for (ETP None: TP)."""
    m = cfg.model
    return (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size,
            m.virtual_pipeline_model_parallel_size, m.expert_model_parallel_size, expert_tensor_parallel_size(cfg))


def current_layout() -> Layout | None:
    """The (TP, PP, CP, VP, EP, ETP) sizes of megatron-core's parallel state in this process; None when it has
    none."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return None
    return (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
            ps.get_context_parallel_world_size(), ps.get_virtual_pipeline_model_parallel_world_size(),
            ps.get_expert_model_parallel_world_size(), ps.get_expert_tensor_parallel_world_size())


def initialize(cfg: "ConfigContainer", device: torch.device, seed: int) -> None:
    """Create megatron-core's process groups for ``cfg.model``'s layout (once per process; a second call with the
    same sizes is a no-op) and seed its model-parallel RNG tracker with ``seed``.

    Raises:
        MegatronCoreNeedsCudaError: ``device`` is not a CUDA device.
        MegatronBridgeError: megatron-core's groups already exist with other sizes.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    require_cuda(device)
    m = cfg.model
    current, wanted = current_layout(), layout(cfg)
    if current is not None and current != wanted:
        raise MegatronBridgeError(
            f"megatron-core's parallel state already exists with (TP, PP, CP, VP, EP, ETP) = {current}, but the "
            f"config asks for {wanted}: call megatron_bridge.engines.megatron_core.parallel_state.destroy() first")
    if current is None:
        ps.initialize_model_parallel(
            tensor_model_parallel_size=m.tensor_model_parallel_size,
            pipeline_model_parallel_size=m.pipeline_model_parallel_size,
            virtual_pipeline_model_parallel_size=m.virtual_pipeline_model_parallel_size,
            context_parallel_size=m.context_parallel_size,
            expert_model_parallel_size=m.expert_model_parallel_size,
            expert_tensor_parallel_size=wanted[5],
            distributed_timeout_minutes=cfg.dist.distributed_timeout_minutes,
            order=MCORE_ORDER,
        )
        log_rank_0(logger, "megatron-core parallel state: TP %d, PP %d, CP %d, DP %d, EP %d, ETP %d", *wanted[:3],
                   ps.get_data_parallel_world_size(), *wanted[4:])
        if m.virtual_pipeline_model_parallel_size is not None:
            log_rank_0(logger, "megatron-core virtual pipeline stages per rank: %d",
                       m.virtual_pipeline_model_parallel_size)
    model_parallel_cuda_manual_seed(seed)


def destroy() -> None:
    """Reset megatron-core's parallel state if this process initialized it (before the default group goes).

    megatron-core's ``destroy_model_parallel`` forgets its groups without destroying them (only its gloo data-parallel
    groups are destroyed): they stay alive, threads and sockets included, until the default group is destroyed."""
    import sys

    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is not None and ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
