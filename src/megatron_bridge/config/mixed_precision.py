"""``cfg.mixed_precision``: named precision presets (``bf16_mixed``, ``fp16_mixed``, ``fp32``)."""

from collections.abc import Callable
from dataclasses import dataclass

from megatron_bridge.config.model import DType


@dataclass(kw_only=True)
class MixedPrecisionConfig:
    """How the model computes and reduces: the master weights stay in params_dtype, matmuls run in compute_dtype."""

    bf16: bool = False
    """Compute in bfloat16."""
    fp16: bool = False
    """Compute in float16 with loss scaling."""
    params_dtype: DType = "float32"
    """Storage dtype of the master weights (copied to model.params_dtype). Differs from Megatron-Bridge, whose
    bf16_mixed/fp16_mixed store the model in bf16/fp16 with fp32 main weights in the optimizer: here the weights
    stay fp32 and the forward computes in bf16/fp16 (autocast, or FSDP2's MixedPrecisionPolicy)."""
    grad_reduce_in_fp32: bool = True
    """Reduce gradients in fp32 (copied to ddp.grad_reduce_in_fp32)."""
    loss_scale: float | None = None
    """fp16 static loss scale; None means dynamic (copied to optimizer.loss_scale)."""
    initial_loss_scale: float = 2.0**16
    """fp16 initial dynamic loss scale (copied to optimizer.initial_loss_scale)."""

    @property
    def compute_dtype(self) -> DType:
        """The dtype matmuls run in."""
        if self.bf16:
            return "bfloat16"
        if self.fp16:
            return "float16"
        return "float32"


MIXED_PRECISION_PRESETS: dict[str, Callable[[], MixedPrecisionConfig]] = {}


def _register(name: str) -> Callable[[Callable[[], MixedPrecisionConfig]], Callable[[], MixedPrecisionConfig]]:
    def wrap(fn: Callable[[], MixedPrecisionConfig]) -> Callable[[], MixedPrecisionConfig]:
        MIXED_PRECISION_PRESETS[name] = fn
        MIXED_PRECISION_PRESETS[name.replace("_", "-")] = fn
        return fn

    return wrap


@_register("bf16_mixed")
def bf16_mixed() -> MixedPrecisionConfig:
    """bf16 compute, fp32 master weights and fp32 gradient reduction."""
    return MixedPrecisionConfig(bf16=True, grad_reduce_in_fp32=True)


@_register("fp16_mixed")
def fp16_mixed() -> MixedPrecisionConfig:
    """fp16 compute with dynamic loss scaling, fp32 master weights and fp32 gradient reduction."""
    return MixedPrecisionConfig(fp16=True, grad_reduce_in_fp32=True)


@_register("fp32")
def fp32() -> MixedPrecisionConfig:
    """Everything in fp32 (the CPU default; bit-exact tests use it)."""
    return MixedPrecisionConfig(grad_reduce_in_fp32=True)


def get_mixed_precision_preset(name: str) -> MixedPrecisionConfig:
    """Resolve a preset name; an unknown name raises a ConfigValidationError listing the known ones."""
    from megatron_bridge.errors import ConfigValidationError

    if name not in MIXED_PRECISION_PRESETS:
        known = sorted(n for n in MIXED_PRECISION_PRESETS if "-" not in n)
        raise ConfigValidationError(
            f"mixed_precision={name!r} is not a known preset; use one of {known} or a MixedPrecisionConfig.",
            ("mixed_precision",),
        )
    return MIXED_PRECISION_PRESETS[name]()
