"""pretrain() under pipeline parallelism (torch.distributed.pipelining) on gloo: parity with a one-process run.

Every layout trains the same tiny Llama on the same global batches as a single-process PP=1 reference computed by
the launching process; per-step losses (relative 1e-5), the validation loss and the final weights (absolute 1e-5,
all stages gathered) must match. fp32; runs differ only in float summation order (measured: losses within 2e-7,
weights within 1e-7). One torchrun launch per test; a launch may run several pretrain() calls on one process group.

Run one directly:
    python -m torch.distributed.run --nproc_per_node=2 -m pytest \
        tests/functional_tests/training/test_pipeline_parallel.py::test_pp2_1f1b_ddp -s
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
from tests.functional_tests.launcher import is_worker, launch
from tests.functional_tests.training._common import FullWeights, max_weight_diff, small_config


LOSS_RTOL = 1e-5
WEIGHT_ATOL = 1e-5
STEPS = 4

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]


def pp_config(**overrides: Any) -> ConfigContainer:
    """4 layers, 4 steps of 8 samples (micro-batch 2), one validation batch at the end. Vocabulary 512 so the
    padded embedding is the same at TP 1 and 2 (one reference for every layout)."""
    cfg = small_config(**{"train_iters": STEPS, **overrides})
    cfg.model.vocab_size, cfg.model.make_vocab_size_divisible_by = 512, 128
    cfg.validation.eval_iters = 1
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
    return result.losses


def _launch(name: str, reference: Path | None, nproc: int) -> None:
    launch(f"{__file__}::{name}", nproc=nproc, env={"MB_REFERENCE": str(reference)}, timeout=600)


def test_pp2_1f1b_ddp(reference: Path | None) -> None:
    if not is_worker():
        _launch("test_pp2_1f1b_ddp", reference, 2)
        return
    run_and_compare("PP2 1F1B DDP", pipeline_model_parallel_size=2)


def test_pp2_vpp2_interleaved(reference: Path | None) -> None:
    """Two model chunks per rank; DDP switches to torch's FSDP-based replicate."""
    if not is_worker():
        _launch("test_pp2_vpp2_interleaved", reference, 2)
        return
    run_and_compare("PP2 VPP2 Interleaved1F1B", pipeline_model_parallel_size=2,
                    virtual_pipeline_model_parallel_size=2)


def test_zero_bubble_schedules_match_1f1b(reference: Path | None) -> None:
    """InterleavedZeroBubble, ZBVZeroBubble and DualPipeV (PP2 × VP2) give 1F1B's losses (and the reference's)."""
    if not is_worker():
        _launch("test_zero_bubble_schedules_match_1f1b", reference, 2)
        return
    one_f_one_b = run_and_compare("PP2 1F1B", pipeline_model_parallel_size=2)
    for schedule in ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"):
        losses = run_and_compare(schedule, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                                 **{"model.pipeline_schedule": schedule})
        assert all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(losses, one_f_one_b, strict=True)), schedule


def test_uneven_stages(reference: Path | None) -> None:
    """num_layers_in_first_pipeline_stage=1 (1 + 3 layers), and the embedding and loss counted as layers over
    PP2 × VP3 (stage 0 holds only the embedding, stage 5 only the output layer and loss)."""
    if not is_worker():
        _launch("test_uneven_stages", reference, 2)
        return
    run_and_compare("PP2 first=1", pipeline_model_parallel_size=2, **{"model.num_layers_in_first_pipeline_stage": 1})
    run_and_compare("PP2 VP3 account_for_embedding/loss", pipeline_model_parallel_size=2,
                    virtual_pipeline_model_parallel_size=3,
                    **{"model.account_for_embedding_in_pipeline_split": True,
                       "model.account_for_loss_in_pipeline_split": True})


def test_pp4(reference: Path | None) -> None:
    if not is_worker():
        _launch("test_pp4", reference, 4)
        return
    run_and_compare("PP4 1F1B", pipeline_model_parallel_size=4)


def test_pp2_fsdp2_dp2(reference: Path | None) -> None:
    if not is_worker():
        _launch("test_pp2_fsdp2_dp2", reference, 4)
        return
    run_and_compare("PP2 × FSDP2 DP2", pipeline_model_parallel_size=2, use_torch_fsdp2=True)


def test_pp2_tp2(reference: Path | None) -> None:
    if not is_worker():
        _launch("test_pp2_tp2", reference, 4)
        return
    run_and_compare("PP2 × TP2 (FSDP2)", pipeline_model_parallel_size=2, tensor_model_parallel_size=2,
                    use_torch_fsdp2=True)


def test_pp2_cp2(reference: Path | None) -> None:
    """Pipeline stages with context parallelism (each CP rank runs its zig-zag slice through the stages)."""
    if not is_worker():
        _launch("test_pp2_cp2", reference, 4)
        return
    run_and_compare("PP2 × CP2 (DDP)", pipeline_model_parallel_size=2, context_parallel_size=2)


def test_pp2_dp2_tp2_eight_ranks(reference: Path | None) -> None:
    if not is_worker():
        _launch("test_pp2_dp2_tp2_eight_ranks", reference, 8)
        return
    run_and_compare("PP2 × DP2 × TP2 (FSDP2, 8 ranks)", pipeline_model_parallel_size=2,
                    tensor_model_parallel_size=2, use_torch_fsdp2=True)


# ------------------------------------------------------------------------------------------- resume across layouts
def resume_phase(root: Path, phase: int, **layout: Any) -> list[float]:
    """Worker: phase 1..3 of a 6-step run (stops after step 2 × phase and saves; resumes from ``root``), or the
    whole run uninterrupted (phase 0)."""
    from megatron_bridge.training.pretrain import pretrain

    _join_group()
    cfg = pp_config(train_iters=6, **layout)
    cfg.validation.eval_interval = None
    cfg.train.exit_interval = 2 * phase if phase in (1, 2) else None
    cfg.checkpoint.save = cfg.checkpoint.load = str(root)
    cfg.checkpoint.save_interval = 2
    result = pretrain(cfg)
    expected = list(range(1, 7)) if phase == 0 else [2 * phase - 1, 2 * phase]
    assert result.steps == expected, result.steps
    return result.losses


def test_resume_across_pipeline_layouts(tmp_path: Path) -> None:
    """Steps 1-2 at PP2 × VP2, steps 3-4 at PP1 (DP2), steps 5-6 at PP2 1F1B (each resuming from the previous
    layout's checkpoint, optimizer state included) equal one uninterrupted PP1 run."""
    if not is_worker():
        launch(f"{__file__}::test_resume_across_pipeline_layouts", nproc=2, timeout=600,
               env={"MB_RESUME_DIR": str(tmp_path)})
        straight = json.loads((tmp_path / "straight.json").read_text())
        resumed = json.loads((tmp_path / "resumed.json").read_text())
        assert resumed == pytest.approx(straight, rel=1e-6, abs=0), (resumed, straight)
        return
    root = Path(os.environ["MB_RESUME_DIR"])
    straight = resume_phase(root / "straight", 0)
    resumed = resume_phase(root / "resumed", 1, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2)
    resumed += resume_phase(root / "resumed", 2)
    resumed += resume_phase(root / "resumed", 3, pipeline_model_parallel_size=2)
    if dist.get_rank() == 0:
        (root / "straight.json").write_text(json.dumps(straight))
        (root / "resumed.json").write_text(json.dumps(resumed))
