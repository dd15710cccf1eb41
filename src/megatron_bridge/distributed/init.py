"""Process groups and device meshes: one code path for torchrun, a plain ``python`` process, CPU/gloo and CUDA/NCCL.

* :func:`initialize_distributed` creates the default process group (or reuses an existing one) and returns a
  :class:`DistEnv`. Launched by torchrun (``RANK``/``WORLD_SIZE`` set) it joins the job through ``env://``;
  otherwise it creates a 1-process group on a TCP store at 127.0.0.1 with a free port, so DDP, FSDP2 and DCP run
  unchanged in a single process.
* :func:`destroy_distributed` tears down the group this module created (barrier first).
* :func:`build_device_mesh` returns the mesh ``("pp", "dp", "cp", "tp")`` (outermost to innermost; ``"pp"``,
  ``"cp"`` and ``"tp"`` only when > 1; TP innermost: the ranks of one TP group are consecutive), with ``"dp_cp"``
  flattened under CP; :func:`split_mesh` / :func:`context_parallel_mesh` / :func:`pipeline_mesh` give its
  sub-meshes, :func:`data_parallel_rank` and :func:`pipeline_parallel_rank` a rank's indices.
"""

import datetime
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from megatron_bridge.distributed.failure import collective_timeout
from megatron_bridge.utils.logging import get_logger, log_rank_0


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

logger = get_logger(__name__)

_CREATED_BY_US = False
"""True while the default process group is one :func:`initialize_distributed` created."""

_RETIRED_GROUPS: list[dist.ProcessGroup] = []
"""The process groups :func:`retire_groups` destroyed (those of :func:`destroy_distributed` among them), kept referenced
until the next :func:`release_retired_groups` (at the next :func:`initialize_distributed`, checkpoint group or
:func:`groups_destroyed_after` block, or the end of the process). torch's gloo backend joins a group's worker threads
in the group's destructor, which runs wherever the last reference goes (e.g. when a DDP model is freed) and holds the
GIL meanwhile; a worker still dropping the tensors of its last collective waits for the GIL: a deadlock (seen when a
run ended with an error right after a collective and the model went with the traceback). Released later, the workers
are long idle. A gloo group's sockets and its thread (waking every 10 ms) go with it."""

_TORCHRUN_GROUPS = 0
"""How many default groups this process has created under torchrun (one per ``pretrain()`` call)."""


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int
    """Global rank."""
    world_size: int
    """Number of processes in the default group."""
    local_rank: int
    """Rank on this node (``LOCAL_RANK``; 0 outside torchrun)."""
    device: torch.device
    """The device this rank computes on: ``cuda:<local_rank>`` with NCCL, else ``cpu``."""
    backend: str
    """Process-group backend: "nccl" or "gloo"."""


def resolve_backend(requested: str | None) -> str:
    """The process-group backend for ``dist.distributed_backend``: None → nccl with CUDA, else gloo.

    Raises:
        ConfigValidationError: nccl is asked for on a machine without CUDA, or the name is unknown (rules
            ``nccl_needs_cuda``, ``field_types``).
    """
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.config.distributed import DistributedInitConfig
    from megatron_bridge.config.rule_set import enforce

    if requested is None:
        return "nccl" if torch.cuda.is_available() else "gloo"
    section = DistributedInitConfig(distributed_backend=requested)  # type: ignore[arg-type]
    enforce(ConfigContainer.holding(section), "field_types", "nccl_needs_cuda")
    return requested


def _device_for(backend: str, local_rank: int) -> torch.device:
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def initialize_distributed(cfg: "ConfigContainer") -> DistEnv:
    """Create (or reuse) the default process group and return this rank's :class:`DistEnv`.

    Backend from ``cfg.dist.distributed_backend`` (None: nccl when CUDA is available, else gloo); collective
    timeout from ``cfg.dist.distributed_timeout_seconds`` or ``distributed_timeout_minutes``. With NCCL,
    ``torch.cuda.set_device(local_rank)``.
    Idempotent: an existing default group is reused as it is (its backend wins).

    Raises:
        ConfigValidationError: nccl without CUDA (names ``dist.distributed_backend``).
    """
    global _CREATED_BY_US
    release_retired_groups()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if dist.is_initialized():
        backend = str(dist.get_backend())
        backend = "nccl" if "nccl" in backend else "gloo"
        return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, _device_for(backend, local_rank), backend)

    backend = resolve_backend(cfg.dist.distributed_backend)
    device = _device_for(backend, local_rank)
    timeout = collective_timeout(cfg)
    if _launched_by_torchrun():
        _join_torchrun_job(backend, timeout)
    else:
        # Port 0: the store binds a free port itself (no race with other jobs on this machine).
        store = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=timeout)
        dist.init_process_group(backend=backend, store=store, rank=0, world_size=1, timeout=timeout)
    _CREATED_BY_US = True
    env = DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)
    log_rank_0(logger, "Initialized process group: backend %s, world size %d, device %s", backend,
               env.world_size, device)
    return env


def _join_torchrun_job(backend: str, timeout: datetime.timedelta) -> None:
    """Join the torchrun job through ``env://``; a second and later group in the same process (``pretrain()`` called
    again) rendezvouses under a fresh store prefix.

    Destroying the default group resets torch's group counter, so a new group would reuse the first one's store keys
    and its peers would read stale addresses and hang. Every rank calls ``pretrain()`` the same number of times, so
    the counter agrees across ranks. Workers restarted by torch's agent (``--max_restarts``) find the previous
    attempt's keys in the same store (the agent keeps it for the whole job): they use a prefix of their attempt
    (``TORCHELASTIC_RESTART_COUNT``, equal on every node under the static rendezvous, see
    :mod:`megatron_bridge.launcher.nodes`).
    """
    global _TORCHRUN_GROUPS
    _TORCHRUN_GROUPS += 1
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if _TORCHRUN_GROUPS == 1 and attempt == 0:
        dist.init_process_group(backend=backend, init_method="env://", timeout=timeout)
        return
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    store = dist.PrefixStore(f"megatron_bridge/attempt{attempt}/group{_TORCHRUN_GROUPS}/", store)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


def destroy_distributed(teardown: Callable[[], None] | None = None) -> None:
    """Barrier, then destroy the default process group if :func:`initialize_distributed` created it; ``teardown``
    runs first (the engine's own groups, :meth:`megatron_bridge.engines.base.Engine.destroy_groups`). The group
    objects stay referenced until the next :func:`initialize_distributed` (:data:`_RETIRED_GROUPS` says why)."""
    global _CREATED_BY_US
    if _CREATED_BY_US and dist.is_initialized():
        if teardown is not None:
            teardown()
        dist.barrier()
        hold_groups()  # every group, the engine's too
        dist.destroy_process_group()
    _CREATED_BY_US = False


def _group_registry() -> "dict[dist.ProcessGroup, object] | None":
    """torch's registry of the live process groups (``_world.pg_map``: private, so None where a torch lacks it)."""
    world = getattr(dist.distributed_c10d, "_world", None)
    return world.pg_map if world is not None else None


def retire_groups(groups: "list[dist.ProcessGroup]") -> None:
    """Destroy each of ``groups`` still registered with torch (local, not collective: every rank calls it for its own),
    keeping it referenced in :data:`_RETIRED_GROUPS`; for groups nothing will use again."""
    registry = _group_registry()
    if registry is None or not dist.is_initialized():
        return
    for pg in groups:
        if pg in registry and pg is not dist.GroupMember.WORLD:
            dist.destroy_process_group(pg)
            _RETIRED_GROUPS.append(pg)


def hold_groups() -> None:
    """Keep every registered group referenced in :data:`_RETIRED_GROUPS` (before the default group is destroyed or
    aborted: torch's ``_abort_process_group`` unregisters them, and their destructors would then run wherever the last
    reference goes, e.g. with a failed run's traceback: the deadlock :data:`_RETIRED_GROUPS` describes)."""
    registry = _group_registry()
    if registry is not None:
        _RETIRED_GROUPS.extend(registry)
    elif dist.is_initialized():  # a torch without the registry: the default group at least
        _RETIRED_GROUPS.append(dist.group.WORLD)


def release_retired_groups() -> None:
    """Drop the references :func:`retire_groups` kept (their threads and sockets end)."""
    _RETIRED_GROUPS.clear()


@contextmanager
def groups_destroyed_after() -> Iterator[None]:
    """Retire (:func:`retire_groups`), when the block ends, the process groups created in it; the groups that existed
    before (the default group among them) stay. For a block that builds groups it will not use again in a process that
    lives on, e.g. megatron-core's parallel state (~20 groups), which ``destroy_model_parallel`` only forgets."""
    registry = _group_registry()
    before = {id(pg) for pg in registry} if registry is not None and dist.is_initialized() else None
    release_retired_groups()
    try:
        yield
    finally:
        if registry is not None and before is not None:
            retire_groups([pg for pg in list(registry) if id(pg) not in before])


def build_device_mesh(cfg: "ConfigContainer", env: DistEnv) -> DeviceMesh:
    """The device mesh of the parallel layout, dimensions outermost to innermost ``("pp", "dp", "cp", "tp")``;
    ``"pp"``, ``"cp"`` and ``"tp"`` are present only when their size is > 1 (TP innermost: the ranks of one TP group
    are consecutive; global rank ``((pp_rank × DP + dp_rank) × CP + cp_rank) × TP + tp_rank``).

    With CP the ``("dp", "cp")`` dimensions are also flattened to ``"dp_cp"``: gradients of replicated parameters are
    reduced, and FSDP2 shards, over data-parallel × context-parallel ranks (as Megatron does).

    Raises:
        ConfigValidationError: a layout the engine does not build (rule ``engine_parallel_layout``), or the
            world size is not a multiple of TP × CP × PP.
    """
    from megatron_bridge.config.rule_set import enforce

    enforce(cfg, "positive_sizes", "engine_parallel_layout", "world_size_divisible", world_size=env.world_size)
    m = cfg.model
    tp, cp, pp = m.tensor_model_parallel_size, m.context_parallel_size, m.pipeline_model_parallel_size
    dims = [("pp", pp), ("dp", env.world_size // (tp * cp * pp)), ("cp", cp), ("tp", tp)]
    dims = [(name, size) for name, size in dims if name == "dp" or size > 1]
    mesh = init_device_mesh(env.device.type, tuple(size for _, size in dims),
                            mesh_dim_names=tuple(name for name, _ in dims))
    if cp > 1:
        mesh["dp", "cp"]._flatten("dp_cp")  # needed: the gradient-reduction / sharding mesh
    elif tp > 1:
        _flatten(mesh)
    return mesh


def _flatten(mesh: DeviceMesh) -> None:
    """Add the flattened ``"dp_tp"`` dimension, so DTensor reduces over both dimensions (the global gradient norm)
    in one collective instead of two. Best effort: ``DeviceMesh._flatten`` is private torch API."""
    try:
        mesh["dp", "tp"]._flatten("dp_tp")
    except (AttributeError, RuntimeError, ValueError, NotImplementedError, KeyError) as exc:
        logger.debug("could not flatten the (dp, tp) mesh: %s", exc)


def split_mesh(mesh: DeviceMesh) -> tuple[DeviceMesh, DeviceMesh | None]:
    """The gradient-reduction mesh (``"dp_cp"`` with CP, else ``"dp"``) and the ``"tp"`` sub-mesh (None without TP)
    of a :func:`build_device_mesh` mesh."""
    names = mesh.mesh_dim_names or ()
    reduce_mesh = mesh["dp_cp"] if "cp" in names else mesh["dp"] if mesh.ndim > 1 else mesh
    return reduce_mesh, mesh["tp"] if "tp" in names else None


def context_parallel_mesh(mesh: DeviceMesh) -> DeviceMesh | None:
    """The ``"cp"`` sub-mesh of a :func:`build_device_mesh` mesh (None without CP)."""
    return mesh["cp"] if "cp" in (mesh.mesh_dim_names or ()) else None


def pipeline_mesh(mesh: DeviceMesh) -> DeviceMesh | None:
    """The ``"pp"`` sub-mesh of a :func:`build_device_mesh` mesh (None without pipeline parallelism)."""
    return mesh["pp"] if "pp" in (mesh.mesh_dim_names or ()) else None


def data_parallel_mesh(cfg: "ConfigContainer", env: DistEnv) -> DeviceMesh:
    """The 1-D gradient-reduction sub-mesh of :func:`build_device_mesh` (``"dp"``, or ``"dp_cp"`` with CP)."""
    return split_mesh(build_device_mesh(cfg, env))[0]


def data_parallel_rank(cfg: "ConfigContainer", rank: int, world_size: int) -> int:
    """This rank's index in the data-parallel dimension of :func:`build_device_mesh`'s layout.

    The mesh is ``("pp", "dp", "cp", "tp")`` with TP innermost, so global rank
    ``((pp_rank × DP + dp_rank) × CP + cp_rank) × TP + tp_rank``: every rank of a TP group, of a CP group (CP ranks
    keep their zig-zag slice) and every pipeline stage of one data-parallel replica reads the same samples.
    """
    tp, cp, pp = (cfg.model.tensor_model_parallel_size, cfg.model.context_parallel_size,
                  cfg.model.pipeline_model_parallel_size)
    dp = max(1, world_size // (tp * cp * pp))
    return (rank // (tp * cp)) % dp


def pipeline_parallel_rank(cfg: "ConfigContainer", rank: int, world_size: int) -> int:
    """This rank's pipeline rank (stage group index) in :func:`build_device_mesh`'s layout."""
    pp = cfg.model.pipeline_model_parallel_size
    return min(pp - 1, rank // max(1, world_size // pp)) if pp > 1 else 0
