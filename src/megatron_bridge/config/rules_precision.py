"""Validation rules of the FP8/FP4 mixed-precision presets (Megatron-Bridge's rules, plus what this machine lacks).

The requirements rule names the preset and everything missing: on the local engine a torchao recipe for the preset,
a CUDA device of the generation it needs and torchao (:mod:`megatron_bridge.config.fp8_local`); on the
transformer-engine engines a CUDA device of the right generation (FP8: compute capability >= 8.9; "mxfp8" and FP4:
Blackwell, >= 10.0; "blockwise": Hopper, 9.x) and transformer-engine that really imports (>= 2.7 for FP4). See
docs/training/low-precision.md. Probes are imported lazily, so configs without FP8 never import torch here.
"""

from typing import TYPE_CHECKING

from megatron_bridge.config.fp8_local import local_engine_problems
from megatron_bridge.config.mixed_precision import FP8_RECIPES, MixedPrecisionConfig, base_preset_of, preset_name_of
from megatron_bridge.config.rule_registry import fail, rule


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

FP8_FORMATS = ("hybrid", "e4m3")
FP4_FORMATS = ("e2m1",)
FP4_RECIPES = ("nvfp4",)
TE_MIN_VERSION_FP4 = "2.7.0"


def _mp(cfg: "ConfigContainer") -> MixedPrecisionConfig | None:
    mp = cfg.mixed_precision
    return mp if isinstance(mp, MixedPrecisionConfig) else None


def describe(mp: MixedPrecisionConfig) -> str:
    """"preset 'bf16_with_mxfp8_mixed' (fp8='e4m3' fp8_recipe='mxfp8')" or the settings alone."""
    name = preset_name_of(mp)
    if name:
        return f"mixed_precision preset {name!r} ({mp.low_precision})"
    base = base_preset_of(mp)
    return f"mixed_precision {mp.low_precision}" + (f" (preset {base!r} with changed fields)" if base else "")


@rule("fp8_fp4_settings", ("mixed_precision.fp8", "mixed_precision.fp4", "mixed_precision.fp8_recipe",
                           "mixed_precision.fp4_recipe"),
      "fp8 and fp4 are not both set; fp8 is 'hybrid'/'e4m3' with a known fp8_recipe; fp4 is 'e2m1' with 'nvfp4'.")
def _fp8_fp4_settings(cfg: "ConfigContainer", world_size: int) -> None:
    mp = _mp(cfg)
    if mp is None:
        return
    if mp.fp8 and mp.fp4:
        fail(f"mixed_precision.fp8={mp.fp8!r} and mixed_precision.fp4={mp.fp4!r} cannot be used together: choose one",
             "mixed_precision.fp8", "mixed_precision.fp4")
    if mp.fp8 is not None and mp.fp8 not in FP8_FORMATS:
        fail(f"mixed_precision.fp8={mp.fp8!r} is not one of {list(FP8_FORMATS)}", "mixed_precision.fp8")
    if mp.fp8_recipe not in FP8_RECIPES:
        fail(f"mixed_precision.fp8_recipe={mp.fp8_recipe!r} is not one of {list(FP8_RECIPES)}",
             "mixed_precision.fp8_recipe")
    if mp.fp4 is not None and mp.fp4 not in FP4_FORMATS:
        fail(f"mixed_precision.fp4={mp.fp4!r} is not one of {list(FP4_FORMATS)}", "mixed_precision.fp4")
    if mp.fp4_recipe not in FP4_RECIPES:
        fail(f"mixed_precision.fp4_recipe={mp.fp4_recipe!r} is not one of {list(FP4_RECIPES)}",
             "mixed_precision.fp4_recipe")


@rule("fp8_bf16_layers", ("mixed_precision.num_layers_at_start_in_bf16", "mixed_precision.num_layers_at_end_in_bf16"),
      "With first_last_layers_bf16, the bf16 layers at start and end are >= 0 and fewer than model.num_layers.")
def _bf16_layers(cfg: "ConfigContainer", world_size: int) -> None:
    mp = _mp(cfg)
    if mp is None or not mp.first_last_layers_bf16:
        return
    start, end = mp.num_layers_at_start_in_bf16, mp.num_layers_at_end_in_bf16
    if start < 0 or end < 0 or start + end >= cfg.model.num_layers:
        fail(f"mixed_precision.num_layers_at_start_in_bf16={start} + mixed_precision.num_layers_at_end_in_bf16={end} "
             f"must be >= 0 each and leave at least one of model.num_layers={cfg.model.num_layers} layers in "
             "low precision",
             "mixed_precision.num_layers_at_start_in_bf16", "mixed_precision.num_layers_at_end_in_bf16")


@rule("mxfp8_param_gather_reuse", ("mixed_precision.fp8_recipe", "mixed_precision.fp8_param_gather",
                                   "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag"),
      "fp8_recipe='mxfp8' with fp8_param_gather outside Megatron FSDP needs reuse_grad_buf_for_mxfp8_param_ag.")
def _mxfp8_reuse(cfg: "ConfigContainer", world_size: int) -> None:
    mp = _mp(cfg)
    if mp is None or not mp.fp8 or mp.fp8_recipe != "mxfp8" or not mp.fp8_param_gather:
        return
    if not cfg.dist.use_megatron_fsdp and not mp.reuse_grad_buf_for_mxfp8_param_ag:
        fail("mixed_precision.fp8_recipe='mxfp8' with fp8_param_gather=True needs "
             "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag=True (outside Megatron FSDP)",
             "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag")


def _capability_problem(mp: MixedPrecisionConfig, capability: tuple[int, int]) -> str | None:
    cc = f"{capability[0]}.{capability[1]}"
    if mp.fp4 or mp.fp8_recipe == "mxfp8":
        return None if capability >= (10, 0) else f"a Blackwell GPU (compute capability >= 10.0; found {cc})"
    if mp.fp8_recipe == "blockwise":
        return None if capability[0] == 9 else f"a Hopper GPU (compute capability 9.x; found {cc})"
    return None if capability >= (8, 9) else f"an FP8 GPU (Ada/Hopper/Blackwell, compute capability >= 8.9; found {cc})"


def low_precision_problems(cfg: "ConfigContainer", mp: MixedPrecisionConfig) -> list[str]:
    """What this machine and config lack for ``mp``'s FP8/FP4 settings (empty: nothing).

    The local engine runs FP8 through torchao (:mod:`megatron_bridge.config.fp8_local`); the megatron-core engine
    through transformer-engine's layers, i.e. megatron-core's TE layer spec.
    """
    from megatron_bridge.utils.packages import cuda_capability, import_problem, package_version, version_at_least

    if cfg.model.engine == "native":
        return local_engine_problems(mp, cuda_capability(), import_problem("torchao.float8"),
                                     package_version("torchao"))
    problems = []
    if cfg.model.transformer_impl != "transformer_engine":
        problems.append(f"the transformer-engine layer spec (model.transformer_impl='transformer_engine'; found "
                        f"{cfg.model.transformer_impl!r}: megatron-core's local spec has no FP8/FP4 layers)")
    capability = cuda_capability()
    if capability is None:
        problems.append("a CUDA device (none is available)")
    else:
        problem = _capability_problem(mp, capability)
        if problem:
            problems.append(problem)
    te_problem = import_problem("transformer_engine.pytorch")
    if te_problem is not None:
        problems.append(f"transformer-engine (import failed: {te_problem}); install megatron-bridge[te] on a CUDA "
                        "machine")
    elif mp.fp4 and not version_at_least(package_version("transformer-engine"), TE_MIN_VERSION_FP4):
        problems.append(f"transformer-engine >= {TE_MIN_VERSION_FP4} for NVFP4 (found "
                        f"{package_version('transformer-engine')})")
    return problems


@rule("fp8_requirements", ("mixed_precision",),
      "FP8/FP4 presets need a CUDA GPU of the right generation and the engine's FP8 library: torchao for the local "
      "engine (tensorwise, mxfp8), transformer-engine and its layer spec (transformer_impl='transformer_engine') "
      "for megatron-core.")
def _fp8_requirements(cfg: "ConfigContainer", world_size: int) -> None:
    mp = _mp(cfg)
    if mp is None or not (mp.fp8 or mp.fp4):
        return
    problems = low_precision_problems(cfg, mp)
    if problems:
        fail(f"{describe(mp)} needs " + "; ".join(problems) + ". Fix: use mixed_precision='bf16_mixed' (or "
             "'fp16_mixed'/'fp32') here, or run on a machine that has them", "mixed_precision")


@rule("fp8_local_compat", ("mixed_precision", "quantization.quant_cfg", "dist.use_megatron_fsdp"),
      "FP8 on the local engine (torchao) runs under DDP or FSDP2, without modelopt quantization; fp8_emulate is "
      "local-engine only.")
def _fp8_local_compat(cfg: "ConfigContainer", world_size: int) -> None:
    mp = _mp(cfg)
    if mp is None or not (mp.fp8 or mp.fp4):
        return
    if cfg.model.engine != "native":
        if mp.fp8_emulate:
            fail(f"mixed_precision.fp8_emulate=True is torchao's emulation on model.engine='native'; "
                 f"model.engine={cfg.model.engine!r} runs FP8 through transformer-engine, which has none. Fix: "
                 "mixed_precision.fp8_emulate=False", "mixed_precision.fp8_emulate")
        return
    if cfg.quantization.quant_cfg is not None:
        fail(f"{describe(mp)} and quantization.quant_cfg={cfg.quantization.quant_cfg!r} both replace the Linear "
             "layers (torchao Float8Linear for FP8 training, modelopt quantizers for QAT): choose one. Fix: "
             "mixed_precision='bf16_mixed' with QAT, or quantization.quant_cfg=None", "mixed_precision",
             "quantization.quant_cfg")
    if cfg.dist.use_megatron_fsdp:
        fail(f"{describe(mp)} on model.engine='native' runs torchao Float8Linear layers, which compose "
             "with DDP and PyTorch FSDP2, not with Megatron FSDP (its FP8 parameter gather is transformer-engine's). "
             "Fix: dist.use_torch_fsdp2=True (and dist.use_megatron_fsdp=False)", "mixed_precision",
             "dist.use_megatron_fsdp")


_COMPUTE_DTYPE = {(True, False): "bfloat16", (False, True): "float16", (False, False): "float32"}


@rule("megatron_core_precision", ("optimizer.bf16", "optimizer.fp16", "model.params_dtype"),
      "With engine='megatron_core', model.params_dtype is the compute dtype (bf16/fp16 weights in Float16Module, "
      "fp32 main weights in megatron-core's optimizer, both in its checkpoints): bfloat16 with optimizer.bf16, "
      "float16 with optimizer.fp16.")
def _mcore_precision(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.model.engine != "megatron_core":
        return
    o, dtype = cfg.optimizer, cfg.model.params_dtype
    if o.bf16 and o.fp16:
        return  # rule precision_exclusive
    want = _COMPUTE_DTYPE[(o.bf16, o.fp16)]
    if dtype != want:
        flags = f"optimizer.bf16={o.bf16}, optimizer.fp16={o.fp16}"
        fail(f"model.params_dtype={dtype!r} with {flags} on model.engine='megatron_core': megatron-core keeps the "
             f"model weights in the compute dtype ({want!r} here) and fp32 main weights in its optimizer "
             "(Megatron-Bridge's meaning). Fix: set mixed_precision='bf16_mixed', 'fp16_mixed' or 'fp32' (it sets "
             f"both), or model.params_dtype={want!r}", "model.params_dtype", "optimizer.bf16", "optimizer.fp16")
