"""pretrain() under pipeline parallelism (torch.distributed.pipelining) on gloo: parity with a one-process run.

Every layout trains the same tiny Llama on the same global batches as a single-process PP=1 reference computed by
the launching process; per-step losses (relative 1e-5), the validation loss and the final weights (absolute 1e-5,
all stages gathered) must match. fp32; runs differ only in float summation order (measured: losses within 2e-7,
weights within 1e-7).

Launches: the tests that use the same number of processes share one torchrun launch (``GROUPS``; launcher.py's
``LaunchGroups``): each worker runs them in order on one process group and reports each, and each stays a test of its
own here, passed or failed on its own. Run one directly on its own:
    python -m torch.distributed.run --nproc_per_node=2 -m pytest \
        tests/functional_tests/training/test_pipeline_parallel.py::test_pp2_1f1b_ddp -s
(MB_REFERENCE must point at a reference file, see ``reference``.)
"""

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.training.callbacks import Callback
from tests.functional_tests.launcher import LaunchGroups, is_worker, selected_groups
from tests.functional_tests.training._common import FullWeights, max_weight_diff, small_config


LOSS_RTOL = 1e-5
WEIGHT_ATOL = 1e-5
STEPS = 4

GROUPS: dict[int, list[str]] = {
    2: ["test_pp2_1f1b_ddp", "test_pp2_vpp2_interleaved", "test_zero_bubble_schedules_match_1f1b",
        "test_uneven_stages", "test_explicit_layout", "test_resume_across_pipeline_layouts"],
    4: ["test_pp4", "test_pp2_fsdp2_dp2", "test_pp2_tp2", "test_pp2_cp2"],
    8: ["test_pp2_dp2_tp2_eight_ranks"],
}
"""Tests launched together, by process count (one launch each)."""
LAUNCH_TIMEOUT_S = {2: 1200, 4: 1200, 8: 900}

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(1500)]


def pp_config(**overrides: Any) -> ConfigContainer:
    """4 layers, 4 steps of 8 samples (micro-batch 2), one validation batch at the end. Vocabulary 512 so the
    padded embedding is the same at TP 1 and 2 (one reference for every layout)."""
    cfg = small_config(**{"train_iters": STEPS, **overrides})
    cfg.model.vocab_size, cfg.model.make_vocab_size_divisible_by = 512, 128
    cfg.validation.eval_interval, cfg.validation.eval_iters = cfg.train.train_iters, 1
    cfg.logger.log_interval = 1
    return cfg


class StageWeights(Callback):
    """Full weights of every pipeline stage (DTensors gathered), merged on rank 0 at the end of training."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    def on_train_end(self, ctx: Any) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        local: dict[str, torch.Tensor] = {}
        for chunk in ctx.backend.chunks:
            state = get_model_state_dict(chunk, options=StateDictOptions(full_state_dict=True))
            local.update({k: v.detach().cpu().clone() for k, v in state.items()})
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, local)
        self.weights = {k: v for part in gathered for k, v in part.items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The single-process PP=1 run (losses, validation loss, full weights), once, in the launching process."""
    if is_worker():
        return None
    from megatron_bridge.training.pretrain import pretrain

    weights = FullWeights()
    result = pretrain(pp_config(), callbacks=[weights])
    path = tmp_path_factory.mktemp("pp_reference") / "reference.pt"
    torch.save({"losses": torch.tensor(result.losses, dtype=torch.float64),
                "eval": torch.tensor(list(result.eval_losses.values()), dtype=torch.float64),
                "weights": weights.weights}, path)
    return path


@pytest.fixture(scope="module")
def launches(reference: Path | None, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The module's launches (launching process only): a group starts when its first test runs and runs the tests
    of that group this session selected."""
    if is_worker():
        return None
    groups = selected_groups(request, GROUPS)
    work = tmp_path_factory.mktemp("pp_runs")
    return LaunchGroups(__file__, groups, LAUNCH_TIMEOUT_S, env={"MB_REFERENCE": str(reference),
                                                                "MB_PP_DIR": str(work)})


_LOSSES: dict[str, list[float]] = {}
"""Worker: losses of the runs this launch made, by label (a later test reuses an identical earlier run)."""


def _join_group() -> None:
    """One process group for the whole launch: pretrain() reuses it (and leaves it alive) between runs."""
    if not dist.is_initialized():
        dist.init_process_group("gloo")


def run_and_compare(label: str, **overrides: Any) -> list[float]:
    """Worker: pretrain() with ``overrides`` on this launch's ranks; assert parity with the reference."""
    from megatron_bridge.training.pretrain import pretrain

    _join_group()
    cfg = pp_config(**{k: v for k, v in overrides.items() if "." not in k})
    for path, value in overrides.items():
        if "." in path:
            section, field = path.split(".")
            setattr(getattr(cfg, section), field, value)
    weights = StageWeights()
    result = pretrain(cfg, callbacks=[weights])
    ref = torch.load(os.environ["MB_REFERENCE"], weights_only=True)
    assert result.final_step == STEPS
    for got, want in zip(result.losses, ref["losses"].tolist(), strict=True):
        assert abs(got - want) <= LOSS_RTOL * abs(want), (label, result.losses, ref["losses"].tolist())
    for got, want in zip(result.eval_losses.values(), ref["eval"].tolist(), strict=True):
        assert abs(got - want) <= LOSS_RTOL * abs(want), (label, result.eval_losses, ref["eval"].tolist())
    diff = max_weight_diff(weights.weights, ref["weights"])
    assert diff <= WEIGHT_ATOL, f"{label}: max weight difference {diff} > {WEIGHT_ATOL}"
    if dist.get_rank() == 0:
        print(f"[pp-parity] {label}: max weight diff {diff:.2e}, losses {result.losses}")
    _LOSSES[label] = result.losses
    return result.losses


@pytest.mark.support_cells("llama:pp")
def test_pp2_1f1b_ddp(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_pp2_1f1b_ddp")
        return
    run_and_compare("PP2 1F1B DDP", pipeline_model_parallel_size=2)


def test_pp2_vpp2_interleaved(launches: LaunchGroups | None) -> None:
    """Two model chunks per rank; DDP switches to torch's FSDP-based replicate."""
    if not is_worker():
        launches.check("test_pp2_vpp2_interleaved")
        return
    run_and_compare("PP2 VPP2 Interleaved1F1B", pipeline_model_parallel_size=2,
                    virtual_pipeline_model_parallel_size=2)


def test_zero_bubble_schedules_match_1f1b(launches: LaunchGroups | None) -> None:
    """InterleavedZeroBubble, ZBVZeroBubble and DualPipeV (PP2 × VP2) give 1F1B's losses (and the reference's).
    The 1F1B run is test_pp2_1f1b_ddp's when it ran earlier in this launch (the same config)."""
    if not is_worker():
        launches.check("test_zero_bubble_schedules_match_1f1b")
        return
    one_f_one_b = _LOSSES.get("PP2 1F1B DDP") or run_and_compare("PP2 1F1B DDP", pipeline_model_parallel_size=2)
    for schedule in ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"):
        losses = run_and_compare(schedule, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                                 **{"model.pipeline_schedule": schedule})
        assert all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(losses, one_f_one_b, strict=True)), schedule


def test_uneven_stages(launches: LaunchGroups | None) -> None:
    """num_layers_in_first_pipeline_stage=1 (1 + 3 layers), and the embedding and loss counted as layers over
    PP2 × VP3 (stage 0 holds only the embedding, stage 5 only the output layer and loss)."""
    if not is_worker():
        launches.check("test_uneven_stages")
        return
    run_and_compare("PP2 first=1", pipeline_model_parallel_size=2, **{"model.num_layers_in_first_pipeline_stage": 1})
    run_and_compare("PP2 VP3 account_for_embedding/loss", pipeline_model_parallel_size=2,
                    virtual_pipeline_model_parallel_size=3,
                    **{"model.account_for_embedding_in_pipeline_split": True,
                       "model.account_for_loss_in_pipeline_split": True})


def test_explicit_layout(launches: LaunchGroups | None) -> None:
    """model.pipeline_model_parallel_layout: PP2 × VP2 "E|tt|tt|L" (stage 0 only the embedding, stage 3 only the
    output layer and loss), and the list form at PP2 (rank 0 only the embedding)."""
    if not is_worker():
        launches.check("test_explicit_layout")
        return
    run_and_compare("PP2 VP2 layout E|tt|tt|L", pipeline_model_parallel_size=2,
                    virtual_pipeline_model_parallel_size=2, **{"model.pipeline_model_parallel_layout": "E|tt|tt|L"})
    run_and_compare("PP2 layout [[E], [t t t t L]]", pipeline_model_parallel_size=2,
                    **{"model.pipeline_model_parallel_layout": [["embedding"], ["decoder"] * 4 + ["loss"]]})


def test_pp4(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_pp4")
        return
    run_and_compare("PP4 1F1B", pipeline_model_parallel_size=4)


def test_pp2_fsdp2_dp2(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_pp2_fsdp2_dp2")
        return
    run_and_compare("PP2 × FSDP2 DP2", pipeline_model_parallel_size=2, use_torch_fsdp2=True)


def test_pp2_tp2(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_pp2_tp2")
        return
    run_and_compare("PP2 × TP2 (FSDP2)", pipeline_model_parallel_size=2, tensor_model_parallel_size=2,
                    use_torch_fsdp2=True)


def test_pp2_cp2(launches: LaunchGroups | None) -> None:
    """Pipeline stages with context parallelism (each CP rank runs its zig-zag slice through the stages)."""
    if not is_worker():
        launches.check("test_pp2_cp2")
        return
    run_and_compare("PP2 × CP2 (DDP)", pipeline_model_parallel_size=2, context_parallel_size=2)


def test_pp2_dp2_tp2_eight_ranks(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_pp2_dp2_tp2_eight_ranks")
        return
    run_and_compare("PP2 × DP2 × TP2 (FSDP2, 8 ranks)", pipeline_model_parallel_size=2,
                    tensor_model_parallel_size=2, use_torch_fsdp2=True)


# ------------------------------------------------------------------------------------------- resume across layouts
RESUME_PHASES = 4
"""Phases of the resumed run (2 steps each)."""


def resume_phase(root: Path, phase: int, **layout: Any) -> list[float]:
    """Worker: phase 1..RESUME_PHASES of a run of 2 × RESUME_PHASES steps (stops after step 2 × phase and saves;
    resumes from ``root``), or the whole run uninterrupted (phase 0)."""
    from megatron_bridge.training.pretrain import pretrain

    _join_group()
    steps = 2 * RESUME_PHASES
    cfg = pp_config(train_iters=steps, **layout)
    cfg.validation.eval_interval = None
    cfg.train.exit_interval = 2 * phase if 0 < phase < RESUME_PHASES else None
    cfg.checkpoint.save = cfg.checkpoint.load = str(root)
    cfg.checkpoint.save_interval = 2
    result = pretrain(cfg)
    expected = list(range(1, steps + 1)) if phase == 0 else [2 * phase - 1, 2 * phase]
    assert result.steps == expected, result.steps
    return result.losses


def test_resume_across_pipeline_layouts(launches: LaunchGroups | None) -> None:
    """Steps 1-2 at PP2 × VP2 (DDP: replicate), steps 3-4 at PP1 (DDP, DP2), steps 5-6 at PP2 1F1B with FSDP2,
    steps 7-8 at PP1 with FSDP2 (DP2), each resuming from the previous layout's checkpoint (optimizer state
    included), equal one uninterrupted PP1 run."""
    if not is_worker():
        launches.check("test_resume_across_pipeline_layouts")
        root = Path(launches.env["MB_PP_DIR"]) / "resume"
        straight = json.loads((root / "straight.json").read_text())
        resumed = json.loads((root / "resumed.json").read_text())
        assert len(resumed) == 2 * RESUME_PHASES
        assert resumed == pytest.approx(straight, rel=1e-6, abs=0), (resumed, straight)
        return
    root = Path(os.environ["MB_PP_DIR"]) / "resume"
    straight = resume_phase(root / "straight", 0)
    resumed = resume_phase(root / "resumed", 1, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2)
    resumed += resume_phase(root / "resumed", 2)
    resumed += resume_phase(root / "resumed", 3, pipeline_model_parallel_size=2, use_torch_fsdp2=True)
    resumed += resume_phase(root / "resumed", 4, use_torch_fsdp2=True)
    if dist.get_rank() == 0:
        (root / "straight.json").write_text(json.dumps(straight))
        (root / "resumed.json").write_text(json.dumps(resumed))
