"""Knowledge distillation on 2 gloo ranks (one torchrun launch): a teacher is trained and saved, then a student of
half its width learns from that checkpoint. The logits distillation loss falls, the teacher's weights are those of
its checkpoint before and after, a run stopped after 2 steps and resumed reproduces the uninterrupted run's losses
bit for bit, and the same student trains with FSDP2 (student sharded, teacher replicated: whole and equal on
every rank). The teacher exported to a Hugging Face folder (through the Bridge) teaches the same losses as its
checkpoint."""

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from megatron_bridge.training.callbacks import Callback
from megatron_bridge.training.pretrain import pretrain
from tests.functional_tests.launcher import TWO_RANKS, is_worker, join_launch_group
from tests.functional_tests.optimization.test_qat import _shared_dir
from tests.functional_tests.training._common import FullWeights, assert_finite_decreasing, small_config


pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

KD = "logits distillation loss"
HF_RTOL = 1e-5
"""The HF folder holds the same float32 weights; only the Bridge's loading path differs."""


def _cfg(**overrides: Any):  # noqa: ANN202
    return small_config(**{"train_iters": 4, "micro_batch_size": 4, "seq_length": 32, "lr": 3e-3,
                           "lr_warmup_iters": 1, **overrides})


def _student(teacher: Path, folder: Path | None = None, **overrides: Any):  # noqa: ANN202
    cfg = _cfg(**overrides)
    cfg.model.hidden_size, cfg.model.ffn_hidden_size = 64, 176  # half the teacher's width
    cfg.distillation.teacher_checkpoint = str(teacher)
    cfg.distillation.skip_lm_loss = False
    if folder is not None:
        cfg.checkpoint.save = cfg.checkpoint.load = str(folder)
        cfg.checkpoint.save_interval = 2
    return cfg


class TeacherWeights(Callback):
    """The teacher's weights at the start and at the end of training."""

    def __init__(self) -> None:
        self.start: dict[str, torch.Tensor] = {}
        self.end: dict[str, torch.Tensor] = {}

    def on_train_start(self, ctx: Any) -> None:
        self.start = {k: v.detach().clone() for k, v in ctx.distiller.teacher.state_dict().items()}
        assert not any(p.requires_grad for p in ctx.distiller.teacher.parameters())

    def on_train_end(self, ctx: Any) -> None:
        self.end = {k: v.detach().clone() for k, v in ctx.distiller.teacher.state_dict().items()}


class TeacherLayout(Callback):
    """Under FSDP2 the student's parameters are DTensor shards; the teacher's are whole tensors on every rank."""

    def __init__(self) -> None:
        self.student_sharded = False
        self.teacher_replicated = False

    def on_train_start(self, ctx: Any) -> None:
        from torch.distributed.tensor import DTensor

        self.student_sharded = all(isinstance(p, DTensor) for p in ctx.backend.chunks[0].parameters())
        teacher = ctx.distiller.teacher
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, {k: float(v.double().sum()) for k, v in teacher.state_dict().items()})
        self.teacher_replicated = (not any(isinstance(p, DTensor) for p in teacher.parameters())
                                   and all(g == gathered[0] for g in gathered))


def test_student_learns_from_teacher_checkpoint(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if not is_worker():
        TWO_RANKS.check(request)
        return
    join_launch_group()  # for the shared folder name; pretrain reuses the group
    root = _shared_dir(tmp_path)
    teacher_cfg = _cfg(train_iters=6)
    teacher_cfg.checkpoint.save = str(root / "teacher")
    trained = FullWeights()
    pretrain(teacher_cfg, callbacks=[trained])

    watch = TeacherWeights()
    straight = pretrain(_student(root / "teacher"), callbacks=[watch])
    assert straight.world_size == 2 and straight.backend == "ddp"
    assert_finite_decreasing(straight.reported_losses[KD], min_drop=0.01)
    assert_finite_decreasing(straight.reported_losses["lm loss"])
    for name, value in trained.weights.items():
        assert torch.equal(watch.start[name], value) and torch.equal(watch.end[name], value), name

    head_cfg = _student(root / "teacher", root / "student")
    head_cfg.train.exit_interval = 2
    head = pretrain(head_cfg)
    tail = pretrain(_student(root / "teacher", root / "student"))
    assert head.losses + tail.losses == straight.losses
    assert head.reported_losses[KD] + tail.reported_losses[KD] == straight.reported_losses[KD]

    layout = TeacherLayout()
    sharded = pretrain(_student(root / "teacher", use_torch_fsdp2=True), callbacks=[layout])
    assert sharded.backend == "fsdp2"
    assert layout.student_sharded and layout.teacher_replicated  # the documented choice (model-optimization.md)
    assert_finite_decreasing(sharded.reported_losses[KD], min_drop=0.01)

    if dist.get_rank() == 0:
        from megatron_bridge.bridge import AutoBridge

        AutoBridge.export_ckpt(root / "teacher", root / "teacher_hf")
    dist.barrier()
    from_hf = _student(root / "teacher_hf")
    from_hf.train.exit_interval = 2
    hf_losses = pretrain(from_hf).reported_losses[KD]
    assert hf_losses == pytest.approx(straight.reported_losses[KD][:2], rel=HF_RTOL)
