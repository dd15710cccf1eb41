"""pretrain() with context parallelism on gloo ranks equals one process (CP=1) step by step.

* ``test_cp2_ddp_pretrain_matches_reference``: 2 ranks, CP=2 (dp=1) with DDP.
* ``test_cp_tp_fsdp2_pretrain_matches_reference``: 4 ranks, cp=2 × tp=2 with sequence parallelism and FSDP2
  (FSDP2 shards over the flattened dp×cp dimension: the 2 CP ranks).
* ``test_llama3_8b_layout_trains_shrunk``: ``llama3_8b_pretrain_config()`` as shipped (TP1 PP1 CP2, bf16 mixed
  precision, its optimizer and schedule) with the model shrunk to 2 small layers, on 2 ranks: finite, falling loss.
* ``test_cp2_checkpoint_resumes_at_cp1``: a CP=2 run saves at step 4 and exits; one process loads it at CP=1 and
  continues to step 8, identically to the uninterrupted reference.

Reference: the same config in the launching process (CP=1, TP=1, one rank). Tolerances (fp32, 8 AdamW steps of 8
samples, seq 64): per-step losses within 1e-5 relative, final weights within 1e-5 absolute. The runs differ only in
float summation order (attention over gathered keys, gradient reduction over dp×cp ranks).

Launches: the 2-rank tests share one torchrun launch (``GROUPS``, launcher.py's ``LaunchGroups``; each stays a test of
its own) on one process group that every run joins and leaves alive (torch 2.13 hangs building a second device mesh
after the default group was destroyed and re-created in the same process).
"""

import os
from pathlib import Path

import pytest
import torch.distributed as dist

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.training.pretrain import pretrain
from tests.functional_tests.launcher import LaunchGroups, is_worker, selected_groups
from tests.functional_tests.training._common import (
    FullWeights,
    assert_finite_decreasing,
    assert_matches_reference,
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
        "test_cp2_checkpoint_resumes_at_cp1"],
    4: ["test_cp_tp_fsdp2_pretrain_matches_reference"],
}
"""Tests launched together, by process count (one launch each)."""


def _config(cp: int = 1, tp: int = 1, **overrides: object) -> ConfigContainer:
    cfg = small_config(context_parallel_size=cp, tensor_model_parallel_size=tp, sequence_parallel=tp > 1,
                       **overrides)
    cfg.model.make_vocab_size_divisible_by = 256 // tp  # the same padded vocabulary at TP=1 and TP=2
    return cfg


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """Single-process CP=1 run of the same config (in the launching process only)."""
    if is_worker():
        return None
    return run_reference(_config(), tmp_path_factory.mktemp("cp_reference"))


@pytest.fixture(scope="module")
def launches(reference: Path | None, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The module's launches (launching process only), running the tests this session selected."""
    if is_worker():
        return None
    work = tmp_path_factory.mktemp("cp_runs")
    return LaunchGroups(__file__, selected_groups(request, GROUPS), {2: 600, 4: 600},
                        env={"MB_REFERENCE": str(reference), "MB_RUN_DIR": str(work / "llama3_8b"),
                             "MB_CKPT": str(work / "ckpt")})


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

    cfg = llama3_8b_pretrain_config(train_iters=6, global_batch_size=4, seq_length=128, lr=3e-3, lr_warmup_iters=1,
                                    eval_interval=None, dir=os.environ["MB_RUN_DIR"])
    m = cfg.model
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size) == (1, 1, 2)
    m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads = 2, 64, 128, 4
    m.num_query_groups, m.vocab_size = 2, 512
    cfg.tokenizer.vocab_size = 512
    cfg.validation.eval_interval = None
    cfg.checkpoint.save = cfg.checkpoint.load = None
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
