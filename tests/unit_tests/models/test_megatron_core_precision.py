"""Mixed precision on the megatron-core engine: every preset mapped to megatron-core's ``TransformerConfig``,
``OptimizerConfig`` and ``DistributedDataParallelConfig`` (built for real; nothing builds a model), the engine-aware
``model.params_dtype`` of the ``mixed_precision_preset`` adjustment, and the rules that refuse FP8/FP4 on this engine
without the transformer-engine spec, transformer-engine, CUDA or the GPU generation. transformer-engine cannot
install here, so FP8 itself runs only in scripts/gpu_check.py (step ``mcore_fp8``)."""

import pytest
import torch

import megatron_bridge.utils.packages as packages
from megatron_bridge.config.adjustments import preset_conflicts
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.mixed_precision import MIXED_PRECISION_PRESETS, get_mixed_precision_preset
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.recipes import tiny_llama_pretrain_config


pytest.importorskip("megatron.core", reason="the megatron-core engine needs megatron-core (Python 3.12 environment)")

from megatron_bridge.engines.megatron_core.ddp import ddp_config  # noqa: E402
from megatron_bridge.engines.megatron_core.optimizer import optimizer_config  # noqa: E402
from megatron_bridge.engines.megatron_core.precision import MegatronCoreLossScaler, transformer_precision  # noqa: E402
from megatron_bridge.engines.megatron_core.provider import transformer_config  # noqa: E402


CPU = torch.device("cpu")
PRESETS = sorted(n for n in MIXED_PRECISION_PRESETS if "-" not in n)
DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# preset -> the TransformerConfig fields Megatron-Bridge's MixedPrecisionConfig.setup gives megatron-core
# (src/megatron/bridge/training/mixed_precision.py: same-name fields copied; fp8_param follows fp8_param_gather)
MB_TRANSFORMER = {
    "bf16_with_fp8_delayed_scaling_mixed": {"fp8": "hybrid", "fp8_recipe": "delayed", "fp8_margin": 0,
                                            "fp8_amax_history_len": 1024, "fp8_amax_compute_algo": "max",
                                            "fp8_param": True, "fp4": None},
    "bf16_with_fp8_current_scaling_mixed": {"fp8": "hybrid", "fp8_recipe": "tensorwise", "fp8_param": True,
                                            "first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 1,
                                            "num_layers_at_end_in_bf16": 1, "fp8_amax_history_len": 1},
    "bf16_with_mxfp8_mixed": {"fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param": True,
                              "first_last_layers_bf16": False},
    "bf16_with_fp8_subchannel_scaling_mixed": {"fp8": "hybrid", "fp8_recipe": "blockwise", "fp8_param": False},
    "bf16_with_nvfp4_mixed": {"fp8": None, "fp4": "e2m1", "fp4_recipe": "nvfp4", "fp4_param": True,
                              "fp8_param": False},
    "bf16_mixed": {"fp8": None, "fp4": None, "fp8_param": False, "fp4_param": False},
    "fp32": {"fp8": None, "fp4": None},
}


def mcore_cfg(preset: str | None, transformer_impl: str = "transformer_engine") -> ConfigContainer:
    """tiny_llama on the megatron-core engine with ``preset``, finalized (not validated: FP8 needs a GPU)."""
    cfg = tiny_llama_pretrain_config()
    cfg.model.engine, cfg.model.transformer_impl = "megatron_core", transformer_impl
    cfg.mixed_precision = preset
    return cfg.finalize()


def _compute(preset: str) -> str:
    return "fp16" if preset.startswith("fp16") else "fp32" if preset == "fp32" else "bf16"


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_maps_to_megatron_core_configs(preset: str) -> None:
    """Megatron-Bridge's meaning of each preset: compute-dtype weights (bf16=/fp16= and the three dtypes), fp32
    main parameters in the optimizer, the FP8/FP4 fields under their megatron-core names."""
    cfg = mcore_cfg(preset)
    mp, compute = get_mixed_precision_preset(preset), _compute(preset)
    tc = transformer_config(cfg.model, CPU, transformer_precision(cfg))
    assert (tc.bf16, tc.fp16) == (compute == "bf16", compute == "fp16")
    assert tc.params_dtype == tc.pipeline_dtype == tc.autocast_dtype == DTYPE[compute]
    for name in ("fp8", "fp8_recipe", "fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo",
                 "first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16", "fp4",
                 "fp4_recipe"):
        assert getattr(tc, name) == getattr(mp, name), name
    assert (tc.fp8_param, tc.fp4_param) == (mp.fp8_param_gather, mp.fp4_param_gather)
    for name, value in MB_TRANSFORMER.get(preset, {}).items():
        assert getattr(tc, name) == value, name
    oc = optimizer_config(cfg)
    assert (oc.bf16, oc.fp16, oc.params_dtype) == (compute == "bf16", compute == "fp16", DTYPE[compute])
    assert oc.fp8_recipe == mp.fp8_recipe and oc.reuse_grad_buf_for_mxfp8_param_ag == \
        mp.reuse_grad_buf_for_mxfp8_param_ag
    assert (oc.loss_scale, oc.initial_loss_scale) == (mp.loss_scale, mp.initial_loss_scale)
    dc = ddp_config(cfg)
    assert dc.grad_reduce_in_fp32 == mp.grad_reduce_in_fp32
    assert (dc.fp8_param_gather, dc.fp4_param_gather) == (mp.fp8_param_gather, mp.fp4_param_gather)
    assert dc.reuse_grad_buf_for_mxfp8_param_ag == mp.reuse_grad_buf_for_mxfp8_param_ag


def test_without_a_preset_the_fields_decide() -> None:
    """mixed_precision=None: the dtype fields as set, FP8/FP4 off (megatron-core's defaults)."""
    cfg = mcore_cfg(None, "local")
    cfg.model.params_dtype, cfg.optimizer.bf16, cfg.ddp.grad_reduce_in_fp32 = "bfloat16", True, False
    cfg.model.pipeline_dtype = "float32"
    tc = transformer_config(cfg.model, CPU, transformer_precision(cfg))
    assert tc.bf16 and tc.params_dtype == torch.bfloat16 and tc.pipeline_dtype == torch.float32
    assert tc.fp8 is None and tc.fp4 is None and not tc.fp8_param
    assert not ddp_config(cfg).grad_reduce_in_fp32
    cfg.validate(world_size=1)


@pytest.mark.parametrize(("preset", "native", "mcore"), [
    ("bf16_mixed", "float32", "bfloat16"), ("fp16_mixed", "float32", "float16"), ("fp32", "float32", "float32"),
    ("bf16_with_fp8_current_scaling_mixed", "float32", "bfloat16"),
])
def test_params_dtype_follows_the_engine(preset: str, native: str, mcore: str) -> None:
    """The documented difference (docs/megatron-bridge-differences.md, docs/training/low-precision.md): the native
    engine keeps fp32 weights under bf16_mixed/fp16_mixed; megatron-core keeps Megatron-Bridge's bf16/fp16 weights."""
    cfg = tiny_llama_pretrain_config()
    cfg.mixed_precision = preset
    assert cfg.finalize().model.params_dtype == native
    assert mcore_cfg(preset).model.params_dtype == mcore


def test_explicit_params_dtype_conflict_is_reported_per_engine() -> None:
    cfg = tiny_llama_pretrain_config()
    cfg.model.engine, cfg.mixed_precision, cfg.model.params_dtype = "megatron_core", "bf16_mixed", "float32"
    assert preset_conflicts(cfg, {"model.params_dtype"}) == [
        "model.params_dtype='float32' would be replaced by mixed_precision='bf16_mixed', which sets 'bfloat16'"]
    cfg.model.engine = "native"
    assert preset_conflicts(cfg, {"model.params_dtype"}) == []


@pytest.mark.parametrize("preset", ["bf16_mixed", "fp16_mixed", "fp32"])
def test_bf16_and_fp16_validate_on_megatron_core(preset: str) -> None:
    """Rule megatron_core_features no longer refuses the bf16/fp16 presets."""
    cfg = tiny_llama_pretrain_config()
    cfg.model.engine, cfg.mixed_precision = "megatron_core", preset
    cfg.validate(world_size=1)


def test_precision_rule_refuses_a_mismatched_dtype() -> None:
    cfg = tiny_llama_pretrain_config()
    cfg.model.engine, cfg.mixed_precision = "megatron_core", None
    cfg.optimizer.bf16 = True
    with pytest.raises(ConfigValidationError, match=r"model.params_dtype='float32' with optimizer.bf16=True") as info:
        cfg.validate(world_size=1)
    assert "[rule megatron_core_precision]" in str(info.value) and "'bfloat16'" in str(info.value)
    cfg.optimizer.fp16 = True  # both flags: rule precision_exclusive's error, not a second one
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=1)
    assert "[rule precision_exclusive]" in str(info.value) and "megatron_core_precision" not in str(info.value)


@pytest.mark.parametrize("preset", ["bf16_mixed", "fp16_mixed"])
@pytest.mark.parametrize("path", ["save", "load", "pretrained_checkpoint"])
def test_bf16_and_fp16_with_checkpoints_validate(preset: str, path: str, tmp_path: object) -> None:
    """bf16/fp16 checkpoints (fp32 main parameters, fp16's loss scaler) resume bit-exact on this engine
    (tests/functional_tests/mcore/test_checkpoint.py): validate() accepts them with megatron-core DDP."""
    cfg = tiny_llama_pretrain_config()
    cfg.model.engine, cfg.mixed_precision = "megatron_core", preset
    cfg.checkpoint.save = cfg.checkpoint.load = cfg.checkpoint.pretrained_checkpoint = None
    setattr(cfg.checkpoint, path, str(tmp_path))
    cfg.validate(world_size=1)
    assert cfg.model.params_dtype == ("bfloat16" if preset == "bf16_mixed" else "float16")


@pytest.mark.parametrize("path", ["save", "load", "pretrained_checkpoint"])
def test_bf16_checkpoints_with_fsdp2_validate(path: str, tmp_path: object) -> None:
    """bf16 torch_dist checkpoints under megatron-core's FSDP2 wrapper (bf16 weights, fp32 main parameters as DTensor
    shards) resume bit-exact (tests/functional_tests/mcore/test_wrappers.py): no refusal of rule
    megatron_core_precision."""
    cfg = tiny_llama_pretrain_config()
    cfg.model.engine, cfg.mixed_precision, cfg.dist.use_torch_fsdp2 = "megatron_core", "bf16_mixed", True
    cfg.checkpoint.save = cfg.checkpoint.load = cfg.checkpoint.pretrained_checkpoint = None
    setattr(cfg.checkpoint, path, str(tmp_path))
    cfg.validate(world_size=2)
    assert cfg.model.params_dtype == "bfloat16"


@pytest.mark.parametrize("path", ["save", "load", "pretrained_checkpoint"])
def test_bf16_checkpoints_with_megatron_fsdp_validate(path: str, tmp_path: object) -> None:
    """bf16 fsdp_dtensor checkpoints under Megatron FSDP (fp32 main weights in megatron-fsdp's buffers, Adam state)
    resume bit-exact (tests/functional_tests/mcore/test_wrappers.py): no refusal of rule megatron_core_precision or
    megatron_core_fsdp."""
    cfg = tiny_llama_pretrain_config()
    cfg.model.engine, cfg.mixed_precision, cfg.dist.use_megatron_fsdp = "megatron_core", "bf16_mixed", True
    cfg.checkpoint.ckpt_format = "fsdp_dtensor"
    cfg.checkpoint.save = cfg.checkpoint.load = cfg.checkpoint.pretrained_checkpoint = None
    setattr(cfg.checkpoint, path, str(tmp_path))
    cfg.validate(world_size=2)
    assert cfg.model.params_dtype == "bfloat16"


def _machine(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int] | None, te_problem: str | None) -> None:
    monkeypatch.setattr(packages, "cuda_capability", lambda: capability)
    monkeypatch.setattr(packages, "import_problem",
                        lambda name: te_problem if name.startswith("transformer_engine") else None)
    monkeypatch.setattr(packages, "package_version", lambda name: "2.8.0")


def _fp8_error(preset: str, transformer_impl: str) -> str:
    cfg = tiny_llama_pretrain_config()
    cfg.model.engine, cfg.model.transformer_impl, cfg.mixed_precision = "megatron_core", transformer_impl, preset
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=1)
    assert "mixed_precision" in info.value.paths
    return str(info.value)


@pytest.mark.parametrize("preset", [p for p in PRESETS if "fp8" in p or "fp4" in p])
def test_fp8_on_the_local_spec_names_the_preset_and_the_te_spec(preset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU machine with transformer-engine, but megatron-core's local spec: refused, naming the TE spec."""
    _machine(monkeypatch, (10, 0) if "mx" in preset or "fp4" in preset else (9, 0), te_problem=None)
    msg = _fp8_error(preset, "local")
    assert f"{preset!r}" in msg and "[rule fp8_requirements]" in msg
    assert "the transformer-engine layer spec (model.transformer_impl='transformer_engine'" in msg
    assert "a CUDA device" not in msg and "transformer-engine (import failed" not in msg


def test_fp8_on_this_machine_names_everything_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    _machine(monkeypatch, None, te_problem="RuntimeError: cudnn shared object not found")
    msg = _fp8_error("bf16_with_fp8_current_scaling_mixed", "local")
    for missing in ("the transformer-engine layer spec", "a CUDA device", "transformer-engine (import failed: "
                    "RuntimeError"):
        assert missing in msg, missing


@pytest.mark.parametrize(("preset", "capability", "needs"), [
    ("bf16_with_fp8_current_scaling_mixed", (8, 0), "an FP8 GPU"),
    ("bf16_with_mxfp8_mixed", (9, 0), "a Blackwell GPU"),
    ("bf16_with_nvfp4_mixed", (9, 0), "a Blackwell GPU"),
    ("bf16_with_fp8_subchannel_scaling_mixed", (10, 0), "a Hopper GPU"),
])
def test_fp8_on_the_te_spec_names_the_gpu_generation(preset: str, capability: tuple[int, int], needs: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _machine(monkeypatch, capability, te_problem=None)
    msg = _fp8_error(preset, "transformer_engine")
    assert needs in msg and "layer spec" not in msg


@pytest.mark.parametrize(("preset", "capability"), [
    ("bf16_with_fp8_current_scaling_mixed", (9, 0)), ("bf16_with_fp8_delayed_scaling_mixed", (8, 9)),
    ("bf16_with_fp8_subchannel_scaling_mixed", (9, 0)), ("bf16_with_mxfp8_mixed", (10, 0)),
    ("bf16_with_nvfp4_mixed", (10, 0)), ("fp16_with_fp8_current_scaling_mixed", (9, 0)),
])
def test_fp8_on_the_te_spec_validates_where_the_machine_has_it(preset: str, capability: tuple[int, int],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """With the TE spec, transformer-engine and the GPU generation, validate() accepts the preset (what the GPU
    check then runs)."""
    _machine(monkeypatch, capability, te_problem=None)
    cfg = tiny_llama_pretrain_config()
    cfg.model.engine, cfg.model.transformer_impl, cfg.mixed_precision = "megatron_core", "transformer_engine", preset
    cfg.validate(world_size=1)
    assert cfg.model.params_dtype == ("float16" if preset.startswith("fp16") else "bfloat16")


def test_loss_scaler_uses_megatron_cores_scale() -> None:
    class Optimizer:
        def get_loss_scale(self) -> torch.Tensor:
            return torch.tensor([1024.0])

    scaler = MegatronCoreLossScaler(Optimizer())
    assert scaler.get_scale() == 1024.0
    assert torch.equal(scaler.scale(torch.tensor(0.5)), torch.tensor([512.0]))
