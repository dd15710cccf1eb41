"""Any-to-any loading: a checkpoint written by one backend and world size loads into another (model and optimizer
state), giving the same loss on a fixed batch. Three torchrun launches share one folder:

* phase ``one``  (1 rank): DDP writes ``ddp1`` (torch_dist).
* phase ``two``  (2 ranks): DDP writes ``ddp2`` (torch_dist), FSDP2 writes ``fsdp2`` (fsdp_dtensor) and
  ``fsdp2_torch`` (torch); then ddp2 → FSDP2, fsdp2 → DDP, fsdp2_torch → DDP and ddp1 → FSDP2 (1 → 2 ranks).
* phase ``back`` (1 rank): ddp2 → DDP and FSDP2, fsdp2 → DDP and FSDP2, fsdp2_torch → FSDP2 (2 → 1 rank).

Each writer also stores its full weights, full optimizer state and eval loss in ``<name>.ref.pt``; each reader
compares against them.
"""

import os
from pathlib import Path

import torch
import torch.distributed as dist

from tests.functional_tests.launcher import is_worker, launch
from tests.unit_tests.checkpoint.toy import Run, build_run, eval_loss, full_weights, tiny_cfg, train


WRITERS = {  # name -> (backend, ckpt_format)
    "ddp1": ("ddp", "torch_dist"),
    "ddp2": ("ddp", "torch_dist"),
    "fsdp2": ("fsdp2", "fsdp_dtensor"),
    "fsdp2_torch": ("fsdp2", "torch"),
}
READS = {
    "two": [("ddp2", "fsdp2"), ("fsdp2", "ddp"), ("fsdp2_torch", "ddp"), ("ddp1", "fsdp2")],
    "back": [("ddp2", "ddp"), ("ddp2", "fsdp2"), ("fsdp2", "ddp"), ("fsdp2", "fsdp2"), ("fsdp2_torch", "fsdp2")],
}


def full_optimizer_state(run: Run) -> dict[str, torch.Tensor]:
    """Every optimizer state tensor, gathered, keyed ``<param fqn>.<name>`` (the backend's optimizer state dict is
    flat: ``state.<param fqn>.<name>``)."""
    flat = run.backend.optimizer_state_dict(run.optimizer)
    return {key.removeprefix("state."): (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()
            for key, t in flat.items() if key.startswith("state.") and isinstance(t, torch.Tensor)}


def write(root: Path, name: str) -> None:
    backend, fmt = WRITERS[name]
    run = build_run(tiny_cfg(backend=backend, save=str(root / name), ckpt_format=fmt))
    train(run, 2)
    run.manager.save()
    ref = {"eval": eval_loss(run), "model": full_weights(run), "optim": full_optimizer_state(run)}
    if dist.get_rank() == 0:
        torch.save(ref, root / f"{name}.ref.pt")
    dist.barrier()


def read(root: Path, name: str, backend: str) -> None:
    run = build_run(tiny_cfg(backend=backend, load=str(root / name)), seed=11)
    assert run.manager.load()
    ref = torch.load(root / f"{name}.ref.pt", weights_only=True)
    where = f"{name} -> {backend} on {dist.get_world_size()} rank(s)"
    assert run.state.step == 2 and run.scheduler.num_steps == 2, where
    weights = full_weights(run)
    assert all(torch.equal(weights[k], ref["model"][k]) for k in ref["model"]), where
    optim = full_optimizer_state(run)
    assert optim.keys() == ref["optim"].keys(), where
    assert all(torch.equal(optim[k], ref["optim"][k]) for k in optim), where
    assert abs(eval_loss(run) - ref["eval"]) <= 1e-6 * abs(ref["eval"]), where


def shard_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("iter_*/*.distcp"))


def test_any_to_any(tmp_path):
    if not is_worker():
        env = {"CKPT_TEST_DIR": str(tmp_path)}
        launch(f"{__file__}::test_any_to_any", nproc=1, env={**env, "CKPT_TEST_PHASE": "one"}, timeout=180)
        launch(f"{__file__}::test_any_to_any", nproc=2, env={**env, "CKPT_TEST_PHASE": "two"}, timeout=180)
        launch(f"{__file__}::test_any_to_any", nproc=1, env={**env, "CKPT_TEST_PHASE": "back"}, timeout=180)
        return
    root, phase = Path(os.environ["CKPT_TEST_DIR"]), os.environ["CKPT_TEST_PHASE"]
    if phase == "one":
        write(root, "ddp1")
        return
    if phase == "two":
        for name in ("ddp2", "fsdp2", "fsdp2_torch"):
            write(root, name)
        # Replicated DDP tensors are written once (DCP de-duplicates across ranks), not once per rank.
        assert shard_bytes(root / "ddp2") < 1.1 * shard_bytes(root / "ddp1")
        assert len(list((root / "ddp2").glob("iter_*/rng_rank_*.pt"))) == 2
    for name, backend in READS[phase]:
        read(root, name, backend)
