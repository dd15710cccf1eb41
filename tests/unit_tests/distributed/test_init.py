"""Process-group initialization, backend choice and device meshes (in-process, world size 1)."""

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.distributed.init import (
    build_device_mesh,
    data_parallel_mesh,
    data_parallel_rank,
    destroy_distributed,
    initialize_distributed,
    pipeline_parallel_rank,
    resolve_backend,
)
from megatron_bridge.errors import ConfigValidationError


def _pg_timeout() -> timedelta:
    group = dist.distributed_c10d._get_default_group()
    return group._get_backend(torch.device("cpu")).options._timeout


def test_auto_backend_follows_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_backend(None) == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_backend(None) == "nccl"


def test_nccl_without_cuda_names_the_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigValidationError, match="gloo") as info:
        resolve_backend("nccl")
    assert info.value.paths == ("dist.distributed_backend",)


def test_unknown_backend() -> None:
    with pytest.raises(ConfigValidationError, match="'mpi'"):
        resolve_backend("mpi")


def test_plain_process_gets_a_one_rank_group_with_the_configured_timeout() -> None:
    destroy_distributed()  # drop the session group: this test re-creates it through the same path
    assert not dist.is_initialized()
    cfg = ConfigContainer()
    cfg.dist.distributed_timeout_minutes = 3
    cfg.dist.distributed_backend = "gloo"
    env = initialize_distributed(cfg)
    assert dist.is_initialized()
    assert (env.rank, env.world_size, env.backend, env.device) == (0, 1, "gloo", torch.device("cpu"))
    assert _pg_timeout() == timedelta(minutes=3)


def test_existing_group_is_reused() -> None:
    before = dist.distributed_c10d._get_default_group()
    env = initialize_distributed(ConfigContainer())
    assert dist.distributed_c10d._get_default_group() is before
    assert env.world_size == dist.get_world_size()


def test_data_parallel_mesh(process_group) -> None:
    mesh = build_device_mesh(ConfigContainer(), process_group)
    assert mesh.mesh_dim_names == ("dp",) and mesh.size() == 1 and mesh.device_type == "cpu"
    assert data_parallel_mesh(ConfigContainer(), process_group).mesh_dim_names == ("dp",)


def test_mesh_pp_must_divide_world(process_group) -> None:
    cfg = ConfigContainer()
    cfg.model.pipeline_model_parallel_size = 2
    with pytest.raises(ConfigValidationError,
                       match=r"is not divisible by TP×PP×CP .*\[rule world_size_divisible\]") as info:
        build_device_mesh(cfg, process_group)
    assert "model.pipeline_model_parallel_size" in info.value.paths


def test_rank_indices_follow_the_mesh_order() -> None:
    """Global rank = ((pp_rank × DP + dp_rank) × CP + cp_rank) × TP + tp_rank (mesh order pp, dp, cp, tp)."""
    cfg = ConfigContainer()
    cfg.model.pipeline_model_parallel_size, cfg.model.tensor_model_parallel_size = 2, 2
    got = [(pipeline_parallel_rank(cfg, r, 8), data_parallel_rank(cfg, r, 8)) for r in range(8)]
    assert got == [(0, 0), (0, 0), (0, 1), (0, 1), (1, 0), (1, 0), (1, 1), (1, 1)]


@pytest.mark.parametrize("field", ["tensor_model_parallel_size", "context_parallel_size"])
def test_mesh_tp_cp_must_divide_world(process_group, field: str) -> None:
    cfg = ConfigContainer()
    setattr(cfg.model, field, 2)
    with pytest.raises(ConfigValidationError,
                       match=r"is not divisible by TP×PP×CP .*\[rule world_size_divisible\]") as info:
        build_device_mesh(cfg, process_group)
    assert f"model.{field}" in info.value.paths


def test_destroyed_groups_are_released_at_the_next_start_not_when_the_model_goes() -> None:
    """torch's gloo group joins its worker threads in its destructor with the GIL held: released while a worker still
    drops its last collective's tensors, it deadlocks (a run that ended with an error right after a collective)."""
    from megatron_bridge.distributed import init

    destroy_distributed()
    initialize_distributed(ConfigContainer())
    world = dist.group.WORLD
    tensor = torch.ones(3)
    dist.all_reduce(tensor)  # the workers' last collective holds a tensor of this process
    destroy_distributed()
    assert not dist.is_initialized() and any(g is world for g in init._RETIRED_GROUPS)
    initialize_distributed(ConfigContainer())  # the session's group again, as before this test
    assert init._RETIRED_GROUPS == []


def _gloo_threads() -> int:
    """Threads of this process running a gloo group's TCP loop (one per group, waking every 10 ms)."""
    import os

    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{tid}/comm").read().strip())  # noqa: SIM115
        except OSError:  # the thread ended meanwhile
            continue
    return names.count("gloo_tcp_loop")


@pytest.mark.skipif(not hasattr(dist.distributed_c10d, "_world"), reason="torch's group registry moved")
def test_groups_made_in_a_block_end_with_it_and_their_threads_at_the_next_release() -> None:
    from megatron_bridge.distributed import init
    from megatron_bridge.distributed.init import groups_destroyed_after, release_retired_groups

    kept = dist.new_group(backend="gloo")  # made before the block: stays
    with groups_destroyed_after():
        made = [dist.new_group(backend="gloo") for _ in range(3)]
        dist.barrier(group=made[0])
        time.sleep(0.2)  # a new gloo thread names itself once it runs
        inside = _gloo_threads()
    registered = dist.distributed_c10d._world.pg_map
    assert kept in registered and dist.group.WORLD in registered
    assert not any(g in registered for g in made)
    assert all(any(g is r for r in init._RETIRED_GROUPS) for g in made)  # destroyed, referenced until a release
    del made
    release_retired_groups()
    deadline = time.monotonic() + 10
    while _gloo_threads() > inside - 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gloo_threads() <= inside - 3
    dist.barrier(group=kept)
    dist.destroy_process_group(kept)


def test_a_checkpoint_managers_group_ends_with_close_and_a_later_save_makes_a_new_one(tmp_path) -> None:  # noqa: ANN001
    from megatron_bridge.checkpoint import comm
    from megatron_bridge.distributed import init
    from tests.unit_tests.checkpoint.toy import build_run, tiny_cfg, train

    run = build_run(tiny_cfg(save=str(tmp_path / "ckpt")))
    first = run.manager.group
    assert first in dist.distributed_c10d._world.pg_map
    train(run, 1)
    run.manager.close()
    assert first not in dist.distributed_c10d._world.pg_map
    train(run, 1)
    run.manager.save()  # after close: a new group, as every rank makes it at the same point
    second = run.manager.group
    assert second is not first and second in dist.distributed_c10d._world.pg_map
    run.manager.close()
    run.manager.close()  # idempotent
    assert second not in dist.distributed_c10d._world.pg_map
    group = comm.new_checkpoint_group()  # releases the retired ones
    assert group is not None and init._RETIRED_GROUPS == []
    comm.retire_checkpoint_group(group)
