"""Knowledge distillation during pretraining with ``modelopt.torch.distill`` (``cfg.distillation``).

The teacher is one of our checkpoints, built as a plain model from its run_config.yaml (or
``distillation.teacher_model``), or a Hugging Face folder read through the Bridge (``AutoBridge``). It is frozen
(``requires_grad=False``, eval mode) and **replicated** on every rank: it is kept outside the data-parallel wrapper,
so DDP and FSDP2 wrap, shard, checkpoint and optimize the student alone and the student's checkpoints are ordinary
ones. Each micro-batch runs the teacher under ``no_grad`` and the student, then :meth:`Distiller.losses` computes
modelopt's ``LogitsDistillationLoss`` (KL divergence at ``logit_kl_temperature``, over the real vocabulary) per
token, an optional cosine loss per ``intermediate_layer_pairs`` entry (outputs captured by forward hooks), and mixes
them with the student's LM loss as Megatron-Bridge's logits-and-intermediates balancer does (``skip_lm_loss``,
``kd_loss_scale``). Student and teacher may differ in width and depth; they share the tokenizer (same padded
vocabulary).

We drive modelopt's loss modules ourselves instead of ``mtd.convert``: a ``DistillationModel`` makes the teacher a
submodule of the student, so DDP/FSDP2 would wrap it and every state dict would have to hide it.
"""

from functools import partial
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.utils.logging import get_logger, log_rank_0


logger = get_logger(__name__)

STUDENT_LOSS_KEY = "student_loss"
"""Key of the student's LM loss in the balancer's input (modelopt's ``loss_balancers.STUDENT_LOSS_KEY``)."""


def cosine_loss(out_s: torch.Tensor, out_t: torch.Tensor) -> torch.Tensor:
    """Per-token ``1 - cos(student, teacher)`` over the last dimension (``[b, s]``), as Megatron-Bridge's
    HiddenStateCosineLoss."""
    return 1.0 - F.cosine_similarity(out_s.float(), out_t.float(), dim=-1)


def balance(losses: dict[str, torch.Tensor], kd_loss_scale: float, skip_lm_loss: bool) -> dict[str, torch.Tensor]:
    """Megatron-Bridge's logits-and-intermediates balancing of scalar losses.

    ``losses`` holds ``student_loss``, ``logits`` and any intermediate losses. Intermediate losses (averaged) are
    rescaled to the logits loss's magnitude; without ``skip_lm_loss`` the distillation loss is rescaled to
    ``kd_loss_scale`` times the LM loss's magnitude and added to it. Returns ``kd_loss`` (the objective),
    ``logits_loss`` and ``intermediate_loss``.
    """
    rest = dict(losses)
    student = rest.pop(STUDENT_LOSS_KEY)
    logits = rest.pop("logits")
    intermediate = sum(rest.values()) / max(len(rest), 1) if rest else logits.new_zeros(())
    if rest and intermediate.detach() > 0:
        intermediate_scaled = intermediate * (logits.detach() / intermediate.detach())
    else:
        intermediate_scaled = intermediate
    kd = logits + intermediate_scaled
    if skip_lm_loss:
        total = kd
    else:
        if kd.detach() > 0 and student.detach() > 0:
            kd = kd * (student.detach() / kd.detach())
        total = student + kd * kd_loss_scale
    return {"kd_loss": total, "logits_loss": logits, "intermediate_loss": intermediate}


class Distiller:
    """The frozen teacher, the loss modules and the hooks that capture intermediate outputs."""

    def __init__(self, cfg: ConfigContainer, teacher: nn.Module, student: nn.Module) -> None:
        import modelopt.torch.distill as mtd

        d = cfg.distillation
        self.cfg = d
        self.teacher = teacher
        self.vocab_size = cfg.model.vocab_size
        """Logits beyond the real vocabulary (padding rows) are left out of the KL divergence."""
        self.logits_loss = mtd.LogitsDistillationLoss(temperature=d.logit_kl_temperature, reduction="none")
        self._captured: dict[tuple[str, int], torch.Tensor] = {}
        for i, (s_name, t_name) in enumerate(d.intermediate_layer_pairs):
            self._hook(student, s_name, ("student", i), "distillation.intermediate_layer_pairs (student)")
            self._hook(teacher, t_name, ("teacher", i), "distillation.intermediate_layer_pairs (teacher)")

    def _hook(self, model: nn.Module, name: str, key: tuple[str, int], what: str) -> None:
        try:
            module = model.get_submodule(name)
        except AttributeError as exc:
            raise ConfigValidationError(f"{what}: the model has no module {name!r} ({exc})",
                                        ("distillation.intermediate_layer_pairs",)) from exc

        def capture(_module: nn.Module, _inputs: Any, output: Any) -> None:
            self._captured[(key[0], key[1])] = output[0] if isinstance(output, tuple) else output

        module.register_forward_hook(capture)

    def clear(self) -> None:
        """Drop captured intermediate outputs (before each micro-batch)."""
        self._captured.clear()

    @torch.no_grad()
    def teacher_logits(self, tokens: torch.Tensor, position_ids: torch.Tensor | None) -> torch.Tensor:
        """The teacher's logits ``[b, s, vocab]`` (no gradients, eval mode)."""
        self.teacher.eval()
        return self.teacher(tokens, position_ids=position_ids)

    def losses(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, lm_loss: torch.Tensor,
               loss_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Masked sums over tokens: the balanced objective ``kd_loss``, ``logits_loss``, ``intermediate_loss``."""
        mask = loss_mask.to(torch.float32)

        def masked_sum(per_token: torch.Tensor) -> torch.Tensor:
            return torch.sum(per_token.float().reshape(mask.shape) * mask)

        terms = {STUDENT_LOSS_KEY: masked_sum(lm_loss),
                 "logits": masked_sum(self.logits_loss(student_logits[..., : self.vocab_size].float(),
                                                       teacher_logits[..., : self.vocab_size].float()))}
        for i in range(len(self.cfg.intermediate_layer_pairs)):
            s_out, t_out = self._captured.pop(("student", i)), self._captured.pop(("teacher", i))
            terms[f"intermediate_{i}"] = masked_sum(cosine_loss(s_out, t_out))
        return balance(terms, self.cfg.kd_loss_scale, self.cfg.skip_lm_loss)


def _replicated(cfg: ConfigContainer, model: ModelConfig) -> ModelConfig:
    """The teacher runs replicated in this process, on the student's sequences: no model parallelism, no
    meta-device build, no offloading or recomputation; its padded vocabulary must be the student's."""
    import dataclasses

    teacher = dataclasses.replace(model, tensor_model_parallel_size=1, context_parallel_size=1,
                                  sequence_parallel=False, init_model_with_meta_device=False, cpu_offloading=False,
                                  recompute_granularity=None, recompute_method=None,
                                  seq_length=cfg.model.seq_length)
    if teacher.padded_vocab_size != cfg.model.padded_vocab_size:
        raise ConfigValidationError(
            f"the teacher's padded vocabulary ({teacher.padded_vocab_size}) differs from the student's "
            f"({cfg.model.padded_vocab_size}): distillation needs the same tokenizer and model.vocab_size / "
            "make_vocab_size_divisible_by", ("distillation.teacher_checkpoint", "model.vocab_size"))
    return teacher


def teacher_model_config(cfg: ConfigContainer, folder: str) -> ModelConfig:
    """The teacher's architecture: ``distillation.teacher_model``, else the checkpoint's run_config.yaml."""
    from pathlib import Path

    from megatron_bridge.checkpoint.files import RUN_CONFIG_FILENAME
    from megatron_bridge.config.container import ConfigContainer as Container

    if cfg.distillation.teacher_model is not None:
        return _replicated(cfg, cfg.distillation.teacher_model)
    path = Path(folder) / RUN_CONFIG_FILENAME
    if not path.is_file():
        raise ConfigValidationError(f"distillation.teacher_checkpoint: {str(path)!r} is missing; set "
                                    "distillation.teacher_model", ("distillation.teacher_model",))
    return _replicated(cfg, Container.from_yaml(path).model)


def _hf_teacher(cfg: ConfigContainer, folder: str, device: torch.device) -> nn.Module:
    """A teacher from a Hugging Face folder, through the Bridge (every rank reads the folder)."""
    from megatron_bridge.bridge import AutoBridge

    bridge = AutoBridge.from_hf_pretrained(folder)
    tcfg = _replicated(cfg, cfg.distillation.teacher_model or bridge.get_model_config())
    return bridge.to_megatron_model(load_weights=True, provider=tcfg, wrap_with_ddp=False,
                                    use_cpu_initialization=device.type == "cpu")[0]


def build_teacher(cfg: ConfigContainer, device: torch.device) -> nn.Module:
    """Build the teacher from ``distillation.teacher_checkpoint`` (our checkpoint or a HF folder), load its weights
    and freeze it."""
    from megatron_bridge.bridge import is_hf_folder
    from megatron_bridge.models.llama import LlamaModel
    from megatron_bridge.optimization.weights import load_weights_into, resolve_checkpoint_folder

    path = str(cfg.distillation.teacher_checkpoint)
    if is_hf_folder(path):
        teacher, where = _hf_teacher(cfg, path, device), path
    else:
        source = resolve_checkpoint_folder(path, "distillation.teacher_checkpoint")
        teacher, where = LlamaModel(teacher_model_config(cfg, source.path), device=device), source.path
        load_weights_into(teacher, source)
    teacher.requires_grad_(False)
    teacher.eval()
    tcfg = teacher.config
    log_rank_0(logger, "distillation: teacher from %s (%d layers, hidden %d, %.2fM parameters), frozen, replicated",
               where, tcfg.num_layers, tcfg.hidden_size, sum(p.numel() for p in teacher.parameters()) / 1e6)
    return teacher


def _loss_func(distiller: Distiller, batch: dict[str, torch.Tensor], teacher_logits: torch.Tensor | None,
               logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The student's masked LM loss; in training the balanced distillation objective, with both in the report."""
    b, s = batch["tokens"].shape
    lm = F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(), reduction="none").view(b, s)
    mask = batch["loss_mask"].to(torch.float32)
    lm_sum, num_tokens = torch.sum(lm * mask), mask.sum()
    report = {"lm loss": torch.stack([lm_sum.detach(), num_tokens.detach()])}
    if teacher_logits is None:  # evaluation: the student's LM loss, as Megatron-Bridge reports it
        return lm_sum, num_tokens, report
    losses = distiller.losses(logits, teacher_logits, lm, mask)
    report["logits distillation loss"] = torch.stack([losses["logits_loss"].detach(), num_tokens.detach()])
    if distiller.cfg.intermediate_layer_pairs:
        report["intermediate distillation loss"] = torch.stack([losses["intermediate_loss"].detach(),
                                                                num_tokens.detach()])
    return losses["kd_loss"], num_tokens, report


def distillation_forward_step(state: Any, data_iterator: Any, model: nn.Module) -> tuple[torch.Tensor, Any]:
    """The forward step ``pretrain`` uses with ``cfg.distillation``: teacher (training only) and student logits,
    then :func:`_loss_func`. The loop reports the balanced objective as the step's loss ("total loss")."""
    from megatron_bridge.models.loss import get_batch, module_device

    distiller: Distiller = state.distiller
    distiller.clear()
    batch = get_batch(data_iterator, module_device(model))
    position_ids = batch.get("position_ids")
    teacher_logits = distiller.teacher_logits(batch["tokens"], position_ids) if model.training else None
    logits = model(batch["tokens"], position_ids=position_ids)
    return logits, partial(_loss_func, distiller, batch, teacher_logits)
