"""Distillation losses in one process: modelopt's KL logits loss, the cosine intermediate loss through hooks, and
Megatron-Bridge's balancing of the terms with the student's LM loss."""

import pytest
import torch

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.models.llama import LlamaModel
from megatron_bridge.optimization.distillation import STUDENT_LOSS_KEY, Distiller, balance, cosine_loss
from tests.unit_tests.models.configs import tiny


pytest.importorskip("modelopt.torch.distill")


def _cfg(**distillation: object) -> ConfigContainer:
    cfg = ConfigContainer(model=tiny())
    cfg.distillation.teacher_checkpoint = "unused"
    for key, value in distillation.items():
        setattr(cfg.distillation, key, value)
    return cfg


def test_balance_skip_lm_loss_uses_distillation_terms_only() -> None:
    terms = {STUDENT_LOSS_KEY: torch.tensor(4.0), "logits": torch.tensor(2.0), "intermediate_0": torch.tensor(0.5)}
    out = balance(terms, kd_loss_scale=3.0, skip_lm_loss=True)
    assert out["kd_loss"].item() == pytest.approx(4.0)  # logits + intermediate rescaled to the logits' magnitude
    assert out["intermediate_loss"].item() == pytest.approx(0.5)


def test_balance_rescales_distillation_to_lm_loss() -> None:
    lm = torch.tensor(4.0, requires_grad=True)
    logits = torch.tensor(0.5, requires_grad=True)
    out = balance({STUDENT_LOSS_KEY: lm, "logits": logits}, kd_loss_scale=0.5, skip_lm_loss=False)
    assert out["kd_loss"].item() == pytest.approx(4.0 + 0.5 * 4.0)
    out["kd_loss"].backward()
    assert lm.grad.item() == pytest.approx(1.0)
    assert logits.grad.item() == pytest.approx(0.5 * 4.0 / 0.5)  # the rescaling factor is a constant


def test_distiller_logits_and_intermediate_losses() -> None:
    torch.manual_seed(0)
    student, teacher = LlamaModel(tiny()), LlamaModel(tiny())
    distiller = Distiller(_cfg(intermediate_layer_pairs=[["norm", "norm"]]), teacher, student)
    ids = torch.randint(0, 100, (2, 16))
    t_logits = distiller.teacher_logits(ids, None)
    s_logits = student(ids)
    lm = torch.nn.functional.cross_entropy(s_logits.flatten(0, 1), ids.flatten(), reduction="none").view(2, 16)
    out = distiller.losses(s_logits, t_logits, lm, torch.ones(2, 16))
    assert out["logits_loss"] > 0 and out["intermediate_loss"] > 0
    out["kd_loss"].backward()
    assert student.norm.weight.grad is not None and teacher.norm.weight.grad is None
    assert distiller.logits_loss(t_logits, t_logits).abs().max() < 1e-5  # identical logits: zero KL


def test_cosine_loss_is_zero_for_parallel_vectors() -> None:
    x = torch.randn(2, 3, 8)
    assert cosine_loss(x, 2 * x).abs().max() < 1e-6


def test_unknown_intermediate_module_is_named() -> None:
    with pytest.raises(ConfigValidationError, match="no_such_module"):
        Distiller(_cfg(intermediate_layer_pairs=[["no_such_module", "norm"]]), LlamaModel(tiny()), LlamaModel(tiny()))
