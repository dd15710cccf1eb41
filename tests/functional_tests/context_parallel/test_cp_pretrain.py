"""pretrain() with context parallelism on gloo ranks equals one process (CP=1) step by step.

* ``test_cp2_ddp_pretrain_matches_reference``: 2 ranks, CP=2 (dp=1) with DDP.
* ``test_cp_tp_fsdp2_pretrain_matches_reference``: 4 ranks, cp=2 × tp=2 with sequence parallelism and FSDP2
  (FSDP2 shards over the flattened dp×cp dimension: the 2 CP ranks).
* ``test_llama3_8b_layout_trains_shrunk``: ``llama3_8b_pretrain_config()`` as shipped (TP1 PP1 CP2, bf16 mixed
  precision, its optimizer and schedule) with the model shrunk to 2 small layers, on 2 ranks: finite, falling loss.
* ``test_cp2_checkpoint_resumes_at_cp1``: a CP=2 run saves at step 4 and exits; one process loads it at CP=1 and
  continues to step 8, identically to the uninterrupted reference.
* ``test_megatron_fsdp_cp2_llama3_8b_matches_reference`` (2 ranks, CP=2, dp=1) and
  ``test_megatron_fsdp_cp2_dp2_llama3_8b_matches_reference`` (4 ranks, CP=2 × DP=2): the shrunk llama3_8b with
  Megatron FSDP (the seed's five overrides; the perf harness's overrides with meta-device init at 4 ranks), sharded
  over the dp×cp ranks, through the Megatron FSDP CPU harness (tests/functional_tests/megatron_fsdp_cpu_harness.py;
  skipped with CUDA): 8 steps equal the one-process reference, saving fsdp_dtensor checkpoints at step 4 and 8; a
  second run in the same processes loads step 4 and repeats steps 5-8 bit for bit (losses and final weights). The
  harness patches torch.cuda and the collectives for the rest of the launch, so these run last in their groups.

Reference: the same config in the launching process (CP=1, TP=1, one rank, DDP); the shrunk llama3_8b's is computed
once per session (``cached_reference``). Tolerances (fp32, 8 AdamW steps of 8 samples, seq 64; the llama3_8b ones:
8 steps of 4 samples, seq 128, fp32 because CPU bf16 rounding depends on the kernels' block shapes): per-step losses
within 1e-5 relative, final weights within 1e-5 absolute. The runs differ only in float summation order (attention over
gathered keys, gradient reduction over dp×cp ranks).

Launches: the 2-rank tests share one torchrun launch (``GROUPS``, launcher.py's ``LaunchGroups``; each stays a test of
its own) on one process group that every run joins and leaves alive (torch 2.13 hangs building a second device mesh
after the default group was destroyed and re-created in the same process).
"""

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.training.pretrain import pretrain
from tests.functional_tests.launcher import LaunchGroups, is_worker, selected_groups
from tests.functional_tests.training._common import (
    FullWeights,
    assert_finite_decreasing,
    assert_matches_reference,
    cached_reference,
    load_reference,
    max_weight_diff,
    run_reference,
    small_config,
)


pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

LOSS_RTOL = 1e-5
WEIGHT_ATOL = 1e-5
GROUPS: dict[int, list[str]] = {
    2: ["test_cp2_ddp_pretrain_matches_reference", "test_llama3_8b_layout_trains_shrunk",
        "test_cp2_checkpoint_resumes_at_cp1", "test_megatron_fsdp_cp2_llama3_8b_matches_reference"],
    4: ["test_cp_tp_fsdp2_pretrain_matches_reference", "test_megatron_fsdp_cp2_dp2_llama3_8b_matches_reference"],
}
"""Tests launched together, by process count (one launch each); the Megatron FSDP ones last (they install the CPU
harness)."""
needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="Megatron FSDP CPU harness test")


def _config(cp: int = 1, tp: int = 1, **overrides: object) -> ConfigContainer:
    cfg = small_config(context_parallel_size=cp, tensor_model_parallel_size=tp, sequence_parallel=tp > 1,
                       **overrides)
    cfg.model.make_vocab_size_divisible_by = 256 // tp  # the same padded vocabulary at TP=1 and TP=2
    return cfg


def _shrunk_llama3_8b(cp: int, run_dir: str, **overrides: Any) -> ConfigContainer:
    """``llama3_8b_pretrain_config()`` with its layout (TP1 PP1, CP ``cp``), optimizer and schedule, the model shrunk
    to 2 layers of hidden 64 (4 heads, 2 KV groups, vocabulary 512), seq 128, 8 steps of 4 samples (``overrides``:
    recipe keywords), no evaluation, checkpoints or TensorBoard."""
    from megatron_bridge.recipes import llama3_8b_pretrain_config

    recipe_kwargs: dict[str, Any] = {"train_iters": 8, "global_batch_size": 4, "seq_length": 128, "lr": 3e-3,
                                     "lr_warmup_iters": 1, "eval_interval": None, "context_parallel_size": cp,
                                     "dir": run_dir, **overrides}
    cfg = llama3_8b_pretrain_config(**recipe_kwargs)
    m = cfg.model
    m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads = 2, 64, 128, 4
    m.num_query_groups, m.vocab_size = 2, 512
    cfg.tokenizer.vocab_size = 512
    cfg.checkpoint.save = cfg.checkpoint.load = None
    cfg.logger.tensorboard_dir = None
    return cfg


def _seed_megatron_fsdp(cfg: ConfigContainer) -> ConfigContainer:
    """The five Megatron FSDP overrides of the seed's example recipe fix-up (megatron-fsdp-skill)."""
    cfg.dist.use_megatron_fsdp = True
    cfg.ddp.use_megatron_fsdp = True
    cfg.ddp.data_parallel_sharding_strategy = "optim_grads_params"
    cfg.ddp.average_in_collective = False
    cfg.checkpoint.ckpt_format = "fsdp_dtensor"
    return cfg


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """Single-process CP=1 run of the same config (in the launching process only)."""
    if is_worker():
        return None
    return run_reference(_config(), tmp_path_factory.mktemp("cp_reference"))


@pytest.fixture(scope="module")
def llama_reference(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path | None:
    """Single-process CP=1 DDP run of the shrunk llama3_8b in fp32 (launching process; once per session, and only
    when a Megatron FSDP test of this file is selected and CUDA is absent)."""
    selected = {item.name for item in request.session.items}
    if is_worker() or torch.cuda.is_available() or not selected & set(MFSDP_TESTS):
        return None
    cfg = _shrunk_llama3_8b(1, str(tmp_path_factory.getbasetemp() / "llama3_8b_reference"), mixed_precision="fp32")
    return cached_reference(cfg, tmp_path_factory)


@pytest.fixture(scope="module")
def launches(reference: Path | None, llama_reference: Path | None, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The module's launches (launching process only), running the tests this session selected."""
    if is_worker():
        return None
    work = tmp_path_factory.mktemp("cp_runs")
    return LaunchGroups(__file__, selected_groups(request, GROUPS), {2: 600, 4: 600},
                        env={"MB_REFERENCE": str(reference), "MB_RUN_DIR": str(work / "llama3_8b"),
                             "MB_CKPT": str(work / "ckpt"), "MB_LLAMA_REFERENCE": str(llama_reference)})


def _join_group() -> None:
    """One process group for the whole launch: pretrain() reuses it (and leaves it alive) between runs."""
    if not dist.is_initialized():
        dist.init_process_group("gloo")


def _run_and_compare(cfg: ConfigContainer, label: str) -> None:
    _join_group()
    weights = FullWeights()
    result = pretrain(cfg, callbacks=[weights])
    assert result.final_step == 8 and result.exit_reason == "train_iters"
    assert_finite_decreasing(result.losses)
    assert_matches_reference(result, weights.weights, loss_rtol=LOSS_RTOL, weight_atol=WEIGHT_ATOL, label=label)


@pytest.mark.support_cells("llama:cp")
def test_cp2_ddp_pretrain_matches_reference(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_cp2_ddp_pretrain_matches_reference")  # type: ignore[union-attr]
        return
    _run_and_compare(_config(cp=2), "CP=2 DDP")


def test_cp_tp_fsdp2_pretrain_matches_reference(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_cp_tp_fsdp2_pretrain_matches_reference")  # type: ignore[union-attr]
        return
    _run_and_compare(_config(cp=2, tp=2, use_torch_fsdp2=True), "CP=2 × TP=2 + SP, FSDP2")


def test_llama3_8b_layout_trains_shrunk(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_llama3_8b_layout_trains_shrunk")  # type: ignore[union-attr]
        return
    from megatron_bridge.recipes import llama3_8b_pretrain_config

    _join_group()

    m = llama3_8b_pretrain_config().model
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size) == (1, 1, 2)
    cfg = _shrunk_llama3_8b(2, os.environ["MB_RUN_DIR"], train_iters=6)
    result = pretrain(cfg)
    assert result.world_size == 2 and result.final_step == 6 and cfg.data_parallel_size(2) == 1
    assert_finite_decreasing(result.losses, min_drop=0.01)


def test_cp2_checkpoint_resumes_at_cp1(reference: Path | None, launches: LaunchGroups | None,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    if is_worker():  # CP=2: train 4 of the 8 steps, save at exit
        _join_group()
        cfg = _config(cp=2)
        cfg.checkpoint.save = os.environ["MB_CKPT"]
        cfg.train.exit_interval = 4
        result = pretrain(cfg)
        assert result.final_step == 4 and result.exit_reason == "exit_interval"
        return
    launches.check("test_cp2_checkpoint_resumes_at_cp1")  # type: ignore[union-attr]
    cfg = _config()  # CP=1, one process: load and continue to step 8
    cfg.checkpoint.load = launches.env["MB_CKPT"]  # type: ignore[union-attr]
    weights = FullWeights()
    result = pretrain(cfg, callbacks=[weights])
    monkeypatch.setenv("MB_REFERENCE", str(reference))
    ref = load_reference()
    assert result.steps == [5, 6, 7, 8]
    for got, want in zip(result.losses, ref["losses"].tolist()[4:], strict=True):
        assert abs(got - want) <= LOSS_RTOL * abs(want), (result.losses, ref["losses"].tolist())
    diff = max_weight_diff(weights.weights, ref["weights"])
    assert diff <= WEIGHT_ATOL, f"max weight difference {diff} after resuming a CP=2 checkpoint at CP=1"


MFSDP_TESTS = ("test_megatron_fsdp_cp2_llama3_8b_matches_reference",
               "test_megatron_fsdp_cp2_dp2_llama3_8b_matches_reference")


def _megatron_fsdp_matches_and_resumes(build: Callable[[], ConfigContainer], ckpt: str, label: str) -> None:
    """Worker: ``build()`` trains 8 steps (fsdp_dtensor checkpoints at 4 and 8) like the one-process reference; a
    second run in these processes loads step 4 and repeats steps 5-8 bit for bit."""
    from tests.functional_tests.megatron_fsdp_cpu_harness import MegatronFullWeights, install

    install()
    _join_group()
    cfg = build()
    cfg.checkpoint.save, cfg.checkpoint.save_interval = ckpt, 4
    weights = MegatronFullWeights()
    full = pretrain(cfg, callbacks=[weights])
    assert full.backend == "megatron_fsdp" and full.final_step == 8 and full.exit_reason == "train_iters"
    assert cfg.model.context_parallel_size == 2 and cfg.data_parallel_size(full.world_size) == full.world_size // 2
    assert_finite_decreasing(full.losses, min_drop=0.01)
    assert_matches_reference(full, weights.weights, loss_rtol=LOSS_RTOL, weight_atol=WEIGHT_ATOL, label=label,
                             reference_env="MB_LLAMA_REFERENCE")
    cfg = build()
    cfg.checkpoint.load, cfg.checkpoint.ckpt_step = ckpt, 4
    resumed_weights = MegatronFullWeights()
    resumed = pretrain(cfg, callbacks=[resumed_weights])
    assert resumed.steps == [5, 6, 7, 8] and resumed.losses == full.losses[4:], (resumed.losses, full.losses)
    assert sorted(resumed_weights.weights) == sorted(weights.weights)
    assert all(torch.equal(resumed_weights.weights[k], weights.weights[k]) for k in weights.weights)


@needs_no_cuda
def test_megatron_fsdp_cp2_llama3_8b_matches_reference(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_megatron_fsdp_cp2_llama3_8b_matches_reference")  # type: ignore[union-attr]
        return
    run_dir = os.environ["MB_RUN_DIR"] + "_mfsdp"
    _megatron_fsdp_matches_and_resumes(
        lambda: _seed_megatron_fsdp(_shrunk_llama3_8b(2, run_dir, mixed_precision="fp32")),
        os.path.join(run_dir, "ckpt"), "shrunk llama3_8b, Megatron FSDP (seed overrides), CP=2")


@needs_no_cuda
def test_megatron_fsdp_cp2_dp2_llama3_8b_matches_reference(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_megatron_fsdp_cp2_dp2_llama3_8b_matches_reference")  # type: ignore[union-attr]
        return
    run_dir = os.environ["MB_RUN_DIR"] + "_mfsdp4"
    _megatron_fsdp_matches_and_resumes(
        lambda: _shrunk_llama3_8b(2, run_dir, mixed_precision="fp32", use_megatron_fsdp=True),
        os.path.join(run_dir, "ckpt"), "shrunk llama3_8b, Megatron FSDP (perf overrides, meta init), CP=2 x DP=2")
