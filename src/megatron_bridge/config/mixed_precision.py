"""``cfg.mixed_precision``: named precision presets, with Megatron-Bridge's names and meanings.

``bf16_mixed``, ``fp16_mixed`` and ``fp32`` run everywhere. The FP8/FP4 presets
(``bf16_with_fp8_delayed_scaling_mixed``, ``bf16_with_fp8_current_scaling_mixed``, ``bf16_with_mxfp8_mixed``,
``bf16_with_fp8_subchannel_scaling_mixed``, ``bf16_with_nvfp4_mixed`` and their ``fp16_`` twins) set the fields
Megatron-Bridge sets; ``validate()`` refuses them, naming the preset and what is missing, unless a CUDA device of the
right generation, transformer-engine and an engine that runs FP8 are present (rules in
:mod:`megatron_bridge.config.rules_precision`; docs/training/low-precision.md).
"""

from collections.abc import Callable
from dataclasses import dataclass, fields

from megatron_bridge.config.declared import DeclaredFields
from megatron_bridge.config.model import DType


FP8_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise")
"""Megatron-Bridge's ``fp8_recipe`` values: per-tensor current scaling, delayed scaling, MXFP8 (Blackwell only),
128x128 / 1x128 blockwise "subchannel" scaling (Hopper only)."""


@dataclass(kw_only=True)
class MixedPrecisionConfig(DeclaredFields):
    """How the model computes and reduces: the master weights stay in params_dtype, matmuls run in compute_dtype."""

    bf16: bool = False
    """Compute in bfloat16."""
    fp16: bool = False
    """Compute in float16 with loss scaling."""
    params_dtype: DType = "float32"
    """Storage dtype of the master weights (copied to model.params_dtype). Differs from Megatron-Bridge, whose
    bf16_mixed/fp16_mixed store the model in bf16/fp16 with fp32 main weights in the optimizer: on the native engine
    the weights stay fp32 and the forward computes in bf16/fp16 (autocast, or FSDP2's MixedPrecisionPolicy). With
    model.engine='megatron_core' Megatron-Bridge's meaning holds: model.params_dtype becomes the compute dtype and
    megatron-core's optimizer keeps fp32 main weights (this field is then not used)."""
    grad_reduce_in_fp32: bool = True
    """Reduce gradients in fp32 (copied to ddp.grad_reduce_in_fp32). Differs from Megatron-Bridge in fp16_mixed, which
    sets False there; True in every preset here."""
    loss_scale: float | None = None
    """fp16 static loss scale; None means dynamic (copied to optimizer.loss_scale)."""
    initial_loss_scale: float = 2.0**16
    """fp16 initial dynamic loss scale (copied to optimizer.initial_loss_scale). Differs from Megatron-Bridge, whose
    default is 2**32."""
    fp8: str | None = None
    """FP8 GEMMs: "hybrid" (E4M3 forward, E5M2 gradients) or "e4m3"; None is off. Needs CUDA (compute capability
    >= 8.9) and, on the local engine, torchao (docs/training/low-precision.md); on the others transformer-engine."""
    fp8_recipe: str = "tensorwise"
    """FP8 scaling recipe: "tensorwise" (current scaling), "delayed", "mxfp8" (Blackwell only) or "blockwise"
    (Hopper only)."""
    fp8_margin: int = 0
    """Delayed scaling: margin (in powers of two) of the scaling factor."""
    fp8_amax_history_len: int = 1
    """Delayed scaling: length of the amax history window."""
    fp8_amax_compute_algo: str = "most_recent"
    """Delayed scaling: "most_recent" or "max" of the amax history."""
    fp8_param_gather: bool = False
    """Keep FP8 copies of the parameters and all-gather them in FP8 (Megatron's fp8_param_gather)."""
    first_last_layers_bf16: bool = False
    """Run the first num_layers_at_start_in_bf16 and last num_layers_at_end_in_bf16 layers in bf16, not FP8/FP4."""
    num_layers_at_start_in_bf16: int = 0
    """With first_last_layers_bf16: leading transformer layers kept out of FP8/FP4."""
    num_layers_at_end_in_bf16: int = 0
    """With first_last_layers_bf16: trailing transformer layers kept out of FP8/FP4."""
    reuse_grad_buf_for_mxfp8_param_ag: bool = False
    """MXFP8 with fp8_param_gather: reuse the gradient buffer for the parameter all-gather (required by
    Megatron-Bridge for mxfp8 + fp8_param_gather outside Megatron FSDP)."""
    fp8_emulate: bool = False
    """Local engine only (not in Megatron-Bridge; torchao's ``emulate``, torchtitan's ``float8.emulate``): cast to
    FP8 exactly as FP8 training does but run the GEMMs in high precision, so FP8 numerics (and FSDP2's FP8
    all-gather) run without an FP8 GPU, on CPU too. For tests and development: no speed-up. validate() then does
    not ask for a CUDA device."""
    fp4: str | None = None
    """FP4 GEMMs through transformer-engine >= 2.7 ("e2m1"); None is off. Exclusive with fp8. Blackwell only."""
    fp4_recipe: str = "nvfp4"
    """FP4 scaling recipe ("nvfp4")."""
    fp4_param_gather: bool = False
    """Keep FP4 copies of the parameters and all-gather them in FP4."""

    @property
    def compute_dtype(self) -> DType:
        """The dtype matmuls run in (outside the FP8/FP4 GEMMs)."""
        if self.bf16:
            return "bfloat16"
        if self.fp16:
            return "float16"
        return "float32"

    @property
    def low_precision(self) -> str | None:
        """A short description of the FP8/FP4 settings ("fp8='hybrid' fp8_recipe='delayed'"), None when off."""
        if self.fp4:
            return f"fp4={self.fp4!r} fp4_recipe={self.fp4_recipe!r}"
        if self.fp8:
            return f"fp8={self.fp8!r} fp8_recipe={self.fp8_recipe!r}"
        return None


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


def _delayed(base: MixedPrecisionConfig) -> MixedPrecisionConfig:
    base.fp8, base.fp8_recipe, base.fp8_margin = "hybrid", "delayed", 0
    base.fp8_amax_history_len, base.fp8_amax_compute_algo, base.fp8_param_gather = 1024, "max", True
    return base


def _current(base: MixedPrecisionConfig) -> MixedPrecisionConfig:
    base.fp8, base.fp8_recipe, base.fp8_param_gather = "hybrid", "tensorwise", True
    base.first_last_layers_bf16, base.num_layers_at_start_in_bf16, base.num_layers_at_end_in_bf16 = True, 1, 1
    return base


def _mxfp8(base: MixedPrecisionConfig) -> MixedPrecisionConfig:
    base.fp8, base.fp8_recipe, base.fp8_param_gather = "e4m3", "mxfp8", True
    base.reuse_grad_buf_for_mxfp8_param_ag = True
    return base


def _subchannel(base: MixedPrecisionConfig) -> MixedPrecisionConfig:
    base.fp8, base.fp8_recipe, base.fp8_param_gather = "hybrid", "blockwise", False
    return base


@_register("bf16_with_fp8_delayed_scaling_mixed")
def bf16_with_fp8_delayed_scaling_mixed() -> MixedPrecisionConfig:
    """bf16 with FP8 delayed scaling (amax history 1024, max): needs CUDA (>= sm89) and transformer-engine."""
    return _delayed(bf16_mixed())


@_register("fp16_with_fp8_delayed_scaling_mixed")
def fp16_with_fp8_delayed_scaling_mixed() -> MixedPrecisionConfig:
    """fp16 with FP8 delayed scaling: needs CUDA (>= sm89) and transformer-engine."""
    return _delayed(fp16_mixed())


@_register("bf16_with_fp8_current_scaling_mixed")
def bf16_with_fp8_current_scaling_mixed() -> MixedPrecisionConfig:
    """bf16 with FP8 per-tensor current scaling, first and last layer in bf16: needs CUDA (>= sm89) and TE."""
    return _current(bf16_mixed())


@_register("fp16_with_fp8_current_scaling_mixed")
def fp16_with_fp8_current_scaling_mixed() -> MixedPrecisionConfig:
    """fp16 with FP8 per-tensor current scaling, first and last layer unquantized: needs CUDA (>= sm89) and TE."""
    return _current(fp16_mixed())


@_register("bf16_with_mxfp8_mixed")
def bf16_with_mxfp8_mixed() -> MixedPrecisionConfig:
    """bf16 with MXFP8 block scaling: needs a Blackwell GPU (sm100+) and transformer-engine."""
    return _mxfp8(bf16_mixed())


@_register("fp16_with_mxfp8_mixed")
def fp16_with_mxfp8_mixed() -> MixedPrecisionConfig:
    """fp16 with MXFP8 block scaling: needs a Blackwell GPU (sm100+) and transformer-engine."""
    return _mxfp8(fp16_mixed())


@_register("bf16_with_fp8_subchannel_scaling_mixed")
def bf16_with_fp8_subchannel_scaling_mixed() -> MixedPrecisionConfig:
    """bf16 with FP8 blockwise (128x128 weights, 1x128 activations) scaling: needs a Hopper GPU (sm90) and TE."""
    return _subchannel(bf16_mixed())


@_register("fp16_with_fp8_subchannel_scaling_mixed")
def fp16_with_fp8_subchannel_scaling_mixed() -> MixedPrecisionConfig:
    """fp16 with FP8 blockwise scaling: needs a Hopper GPU (sm90) and transformer-engine."""
    return _subchannel(fp16_mixed())


@_register("bf16_with_nvfp4_mixed")
def bf16_with_nvfp4_mixed() -> MixedPrecisionConfig:
    """bf16 with NVFP4 (E2M1, 16-element blocks): needs a Blackwell GPU (sm100+) and transformer-engine >= 2.7."""
    cfg = bf16_mixed()
    cfg.fp4, cfg.fp4_recipe, cfg.fp4_param_gather = "e2m1", "nvfp4", True
    return cfg


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


def preset_name_of(mp: MixedPrecisionConfig) -> str | None:
    """The name of the preset ``mp`` equals (None when it was changed after the preset or built by hand)."""
    values = {f.name: getattr(mp, f.name) for f in fields(mp)}
    for name, fn in MIXED_PRECISION_PRESETS.items():
        preset = fn()
        if "-" not in name and all(getattr(preset, k) == v for k, v in values.items()):
            return name
    return None


def base_preset_of(mp: MixedPrecisionConfig) -> str | None:
    """The preset ``mp`` was most likely made from: the first whose compute dtype and FP8/FP4 format and recipe match
    (``-c fp8_cs`` is ``bf16_with_fp8_current_scaling_mixed`` with ``first_last_layers_bf16=False``)."""
    keys = ("bf16", "fp16", "fp8", "fp8_recipe", "fp4", "fp4_recipe")
    for name, fn in MIXED_PRECISION_PRESETS.items():
        preset = fn()
        if "-" not in name and all(getattr(preset, k) == getattr(mp, k) for k in keys):
            return name
    return None
