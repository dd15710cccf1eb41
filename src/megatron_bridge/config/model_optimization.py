"""``cfg.quantization`` and ``cfg.distillation``: nvidia-modelopt quantization-aware training and knowledge
distillation (the ``modelopt`` extra). Both are off by default. docs/training/model-optimization.md.

Names follow Megatron-Bridge where it has them: the quantization formats are the ``--export-quant-cfg`` choices of its
quantization examples (``int8_sq``, ``fp8``, ``int4_awq``, ``w4a8_awq``, ``nvfp4``) plus ``int8`` and ``mxfp8``;
the distillation fields are those of its ``ModelOptDistillConfig`` (``model.kd_config`` there).
"""

from dataclasses import dataclass, field
from typing import Literal

from megatron_bridge.config.declared import DeclaredFields
from megatron_bridge.config.model import ModelConfig


QuantFormat = Literal["int8", "int8_sq", "fp8", "int4_awq", "w4a8_awq", "nvfp4", "mxfp8"]

CPU_QUANT_FORMATS: tuple[str, ...] = ("int8", "int8_sq", "fp8", "int4_awq", "w4a8_awq")
"""Formats whose fake-quant runs on CPU; the others (nvfp4, mxfp8) need CUDA."""


@dataclass(kw_only=True)
class QuantizationConfig(DeclaredFields):
    """Quantization-aware training: ``modelopt.torch.quantization`` fake-quant inserted after the model is built."""

    quant_cfg: QuantFormat | None = None
    """The modelopt format: "int8", "int8_sq" (SmoothQuant), "fp8", "int4_awq", "w4a8_awq" (CPU and GPU), "nvfp4",
    "mxfp8" (CUDA only); None trains unquantized. Megatron-Bridge's --export-quant-cfg names."""
    calib_size: int = 8
    """Training samples (sequences) of the calibration forward passes run before training (Megatron-Bridge's
    --calib-size). Every rank calibrates on the same first samples, so quantizer scales agree across ranks."""
    weight_only: bool = False
    """Quantize weights only (input quantizers disabled), as Megatron-Bridge's --weight-only."""
    disable_quantizers: bool = False
    """Insert and calibrate the quantizers but leave them disabled: the model computes exactly as unquantized (a
    debugging switch; the checkpoint still carries the modelopt state)."""


@dataclass(kw_only=True)
class DistillationConfig(DeclaredFields):
    """Knowledge distillation: a frozen teacher's logits (and optional intermediate outputs) teach the student.

    The teacher is loaded from ``teacher_checkpoint`` (one of this library's checkpoints; its architecture comes
    from the checkpoint's run_config.yaml unless ``teacher_model`` is set). The loss terms are modelopt's
    (``modelopt.torch.distill``); the balancer mixes them with the student's LM loss as Megatron-Bridge does.
    """

    teacher_checkpoint: str | None = None
    """The teacher: a checkpoint root or iter_* folder written by this library, or a Hugging Face folder (read through
    the Bridge). None turns distillation off. Megatron-Bridge takes a teacher model provider (and the KD settings
    under model.kd_config) instead."""
    teacher_model: ModelConfig | None = None
    """The teacher's architecture; None reads the ``model`` section of the checkpoint's run_config.yaml (a HF
    folder's config.json). Megatron-Bridge's teacher provider; ours is always built by the local engine."""
    intermediate_layer_pairs: list[list[str]] = field(default_factory=list)
    """[student module, teacher module] name pairs (e.g. [["norm", "norm"]]) whose outputs get a cosine loss; their
    output widths must agree. Megatron-Bridge's default pairs the final layernorms; ours is none, because a
    narrower student cannot pair hidden states with its teacher."""
    skip_lm_loss: bool = True
    """Train on the distillation loss alone (True) or add the student's LM loss to it (False)."""
    kd_loss_scale: float = 1.0
    """With skip_lm_loss=False, the distillation loss is rescaled to kd_loss_scale times the LM loss's magnitude."""
    logit_kl_temperature: float = 1.0
    """Temperature of the KL divergence between student and teacher logits."""

    @property
    def enabled(self) -> bool:
        """Distillation is on (a teacher checkpoint is set)."""
        return self.teacher_checkpoint is not None
