"""FP8 on the native engine (``model.engine='native'``, "the local engine" in the docs): which Megatron-Bridge
presets map to which torchao training recipe, and what each of the others lacks. Torch-free: ``validate()`` reads
these tables; the conversion itself is :mod:`megatron_bridge.models.float8` (docs/training/low-precision.md).
"""

from megatron_bridge.config.mixed_precision import MixedPrecisionConfig


TORCHAO_MIN_VERSION = "0.18.0"
"""The torchao release the local FP8 path is built and tested with (the ``fp8`` extra pins it)."""
TORCHAO_INSTALL = f"pip install 'megatron-bridge[fp8]' (torchao=={TORCHAO_MIN_VERSION})"

TORCHAO_RECIPES: dict[str, str] = {
    "tensorwise": "torchao.float8 tensorwise: Float8Linear, dynamic per-tensor scales computed every step",
    "mxfp8": "torchao MXFP8TrainingOpConfig 'mxfp8_rceil': MX blocks of 32 elements, E8M0 scales (prototype API)",
}
"""``mixed_precision.fp8_recipe`` → the torchao training recipe the local engine runs for it."""

MIN_CAPABILITY: dict[str, tuple[int, int]] = {"tensorwise": (8, 9), "mxfp8": (10, 0)}
"""Compute capability torchao needs per recipe: ``torch._scaled_mm`` FP8 GEMMs from Ada/Hopper (sm89); MXFP8's
block-scaled GEMMs only on Blackwell (sm100)."""

NOT_ON_LOCAL_ENGINE: dict[str, str] = {
    "delayed": "torchao has no delayed scaling: it was deprecated in torchao 0.9 and deleted in 0.10 "
               "(pytorch/ao#1680, #1753; torchao.float8.ScalingType has only DYNAMIC and DISABLED). Use "
               "bf16_with_fp8_current_scaling_mixed (dynamic per-tensor scaling) on the local engine",
    "blockwise": "torchao's 128x128/1x128 blockwise FP8 training (torchao.prototype.blockwise_fp8_training) is a "
                 "Triton prototype this version does not wire. Use bf16_with_fp8_current_scaling_mixed on the local "
                 "engine",
    "nvfp4": "torchao has no NVFP4 training recipe for dense Linear layers (its NVFP4 configs are for inference and "
             "MoE grouped GEMMs). Use bf16_with_fp8_current_scaling_mixed or bf16_with_mxfp8_mixed on the local "
             "engine",
}
"""Recipes the local engine refuses, and why (the transformer-engine engines run them)."""

FP8_BLOCK_SIZE: dict[str, int] = {"tensorwise": 16, "mxfp8": 32}
"""A Linear is converted only when both its dims are multiples of this (torchao/torchtitan: FP8 tensor cores need
multiples of 16; an MX block is 32 elements along the reduction dim)."""


def local_recipe(mp: MixedPrecisionConfig) -> str:
    """The recipe name the local engine is asked for: ``fp8_recipe``, or ``fp4_recipe`` for FP4 presets."""
    return mp.fp4_recipe if mp.fp4 else mp.fp8_recipe


def local_engine_problems(mp: MixedPrecisionConfig, capability: tuple[int, int] | None,
                          torchao_problem: str | None, torchao_version: str | None) -> list[str]:
    """What FP8 on the local engine lacks here: a torchao recipe for the preset, a CUDA device of the generation
    the recipe needs (not with ``fp8_emulate``), and torchao (>= :data:`TORCHAO_MIN_VERSION`) that imports. Empty:
    nothing."""
    from megatron_bridge.utils.packages import version_at_least

    recipe = local_recipe(mp)
    if recipe in NOT_ON_LOCAL_ENGINE:
        return [f"an FP8 recipe torchao trains with on model.engine='native' ({recipe!r}: "
                f"{NOT_ON_LOCAL_ENGINE[recipe]})"]
    problems = []
    need = MIN_CAPABILITY[recipe]
    if mp.fp8_emulate:
        pass  # high-precision GEMMs: any device
    elif capability is None:
        problems.append("a CUDA device (none is available; torchao's FP8 GEMMs need "
                        f"compute capability >= {need[0]}.{need[1]}; mixed_precision.fp8_emulate=True runs the FP8 "
                        "casts with high-precision GEMMs on CPU, for tests, without a speed-up)")
    elif capability < need:
        gpu = "a Blackwell GPU" if recipe == "mxfp8" else "an FP8 GPU (Ada/Hopper/Blackwell"
        close = "" if recipe == "mxfp8" else ")"
        problems.append(f"{gpu}{close} (compute capability >= {need[0]}.{need[1]}; found "
                        f"{capability[0]}.{capability[1]})")
    if torchao_problem is not None:
        problems.append(f"torchao (import failed: {torchao_problem}); {TORCHAO_INSTALL}")
    elif not version_at_least(torchao_version, TORCHAO_MIN_VERSION):
        problems.append(f"torchao >= {TORCHAO_MIN_VERSION} (found {torchao_version}); {TORCHAO_INSTALL}")
    return problems
