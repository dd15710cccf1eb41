"""FP8/FP4 presets: Megatron-Bridge's values, and validate() naming the preset and what this machine lacks."""

import sys

import pytest

import megatron_bridge.utils.packages as packages
from megatron_bridge.config.mixed_precision import MIXED_PRECISION_PRESETS, get_mixed_precision_preset, preset_name_of
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.recipes import tiny_llama_pretrain_config


# preset -> the fields Megatron-Bridge's preset sets (src/megatron/bridge/training/mixed_precision.py)
MB_PRESETS = {
    "bf16_with_fp8_delayed_scaling_mixed": {"bf16": True, "fp8": "hybrid", "fp8_recipe": "delayed",
                                            "fp8_amax_history_len": 1024, "fp8_amax_compute_algo": "max",
                                            "fp8_param_gather": True},
    "fp16_with_fp8_delayed_scaling_mixed": {"fp16": True, "fp8": "hybrid", "fp8_recipe": "delayed"},
    "bf16_with_fp8_current_scaling_mixed": {"bf16": True, "fp8": "hybrid", "fp8_recipe": "tensorwise",
                                            "first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 1,
                                            "num_layers_at_end_in_bf16": 1, "fp8_param_gather": True},
    "bf16_with_mxfp8_mixed": {"bf16": True, "fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param_gather": True,
                              "reuse_grad_buf_for_mxfp8_param_ag": True},
    "bf16_with_fp8_subchannel_scaling_mixed": {"bf16": True, "fp8": "hybrid", "fp8_recipe": "blockwise",
                                               "fp8_param_gather": False},
    "bf16_with_nvfp4_mixed": {"bf16": True, "fp8": None, "fp4": "e2m1", "fp4_recipe": "nvfp4",
                              "fp4_param_gather": True},
}


@pytest.mark.parametrize("name", sorted(MB_PRESETS))
def test_presets_set_megatron_bridge_values(name: str) -> None:
    mp = get_mixed_precision_preset(name)
    for field, value in MB_PRESETS[name].items():
        assert getattr(mp, field) == value, field
    assert get_mixed_precision_preset(name.replace("_", "-")) == mp
    assert preset_name_of(mp) == name


def _validate_error(preset: str, monkeypatch: pytest.MonkeyPatch, *, capability: tuple[int, int] | None,
                    te_problem: str | None, engine: str = "native") -> str:
    monkeypatch.setattr(packages, "cuda_capability", lambda: capability)
    monkeypatch.setattr(packages, "import_problem", lambda name: te_problem)
    monkeypatch.setattr(packages, "package_version", lambda name: "2.8.0")
    cfg = tiny_llama_pretrain_config()
    cfg.mixed_precision = preset
    cfg.model.engine = engine
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=1)
    assert "mixed_precision" in info.value.paths
    return str(info.value)


def test_fp8_on_cpu_names_preset_and_everything_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    msg = _validate_error("bf16_with_fp8_current_scaling_mixed", monkeypatch, capability=None,
                          te_problem="RuntimeError: cudnn shared object not found", engine="megatron_core")
    assert "'bf16_with_fp8_current_scaling_mixed'" in msg and "fp8_recipe='tensorwise'" in msg
    assert "a CUDA device" in msg and "transformer-engine (import failed: RuntimeError" in msg
    assert "bf16_mixed" in msg  # the fix


@pytest.mark.parametrize(("preset", "capability", "needs"), [
    ("bf16_with_mxfp8_mixed", (9, 0), "a Blackwell GPU"),
    ("bf16_with_nvfp4_mixed", (9, 0), "a Blackwell GPU"),
    ("bf16_with_fp8_subchannel_scaling_mixed", (10, 0), "a Hopper GPU"),
    ("bf16_with_fp8_delayed_scaling_mixed", (8, 0), "an FP8 GPU"),
])
def test_gpu_generation_rules_transformer_engine(preset: str, capability: tuple[int, int], needs: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    msg = _validate_error(preset, monkeypatch, capability=capability, te_problem=None, engine="megatron_core")
    assert needs in msg and "a CUDA device" not in msg and "transformer-engine (" not in msg


# local engine (torchao): preset -> what validate() names on a machine with the given GPU
LOCAL_ENGINE_CASES = [
    ("bf16_with_fp8_current_scaling_mixed", None, "a CUDA device"),
    ("bf16_with_fp8_current_scaling_mixed", (8, 0), "an FP8 GPU (Ada/Hopper/Blackwell) (compute capability >= 8.9"),
    ("bf16_with_mxfp8_mixed", (9, 0), "a Blackwell GPU (compute capability >= 10.0; found 9.0)"),
    ("bf16_with_fp8_delayed_scaling_mixed", (9, 0), "torchao has no delayed scaling"),
    ("fp16_with_fp8_delayed_scaling_mixed", (9, 0), "torchao has no delayed scaling"),
    ("bf16_with_fp8_subchannel_scaling_mixed", (9, 0), "blockwise_fp8_training"),
    ("bf16_with_nvfp4_mixed", (10, 0), "no NVFP4 training recipe"),
]


@pytest.mark.parametrize(("preset", "capability", "needs"), LOCAL_ENGINE_CASES)
def test_local_engine_names_what_torchao_lacks(preset: str, capability: tuple[int, int] | None, needs: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    msg = _validate_error(preset, monkeypatch, capability=capability, te_problem=None)
    assert f"'{preset}'" in msg and needs in msg and "transformer-engine" not in msg.split("Fix:")[0]


def test_local_engine_cpu_message_offers_emulation(monkeypatch: pytest.MonkeyPatch) -> None:
    msg = _validate_error("bf16_with_fp8_current_scaling_mixed", monkeypatch, capability=None, te_problem=None)
    assert "mixed_precision.fp8_emulate=True" in msg


def test_local_engine_without_torchao_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    msg = _validate_error("bf16_with_fp8_current_scaling_mixed", monkeypatch, capability=(9, 0),
                          te_problem="not installed")
    assert "torchao (import failed: not installed)" in msg and "megatron-bridge[fp8]" in msg


@pytest.mark.parametrize(("preset", "capability"), [("bf16_with_fp8_current_scaling_mixed", (9, 0)),
                                                    ("fp16_with_fp8_current_scaling_mixed", (8, 9)),
                                                    ("bf16_with_mxfp8_mixed", (10, 0))])
def test_local_engine_accepts_torchao_recipes_on_their_gpus(preset: str, capability: tuple[int, int],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packages, "cuda_capability", lambda: capability)
    cfg = tiny_llama_pretrain_config(mixed_precision=preset)
    cfg.validate(world_size=1)  # torchao is installed in the test environment


def test_fp8_emulate_validates_on_cpu_and_only_on_the_local_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packages, "cuda_capability", lambda: None)
    cfg = tiny_llama_pretrain_config()
    cfg.mixed_precision = get_mixed_precision_preset("bf16_with_fp8_current_scaling_mixed")
    cfg.mixed_precision.fp8_emulate = True
    cfg.validate(world_size=1)
    cfg.model.engine = "megatron_core"
    with pytest.raises(ConfigValidationError, match="fp8_emulate=True is torchao's emulation"):
        cfg.validate(world_size=1)


def test_local_fp8_refuses_qat_and_megatron_fsdp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packages, "cuda_capability", lambda: (9, 0))
    cfg = tiny_llama_pretrain_config(mixed_precision="bf16_with_fp8_current_scaling_mixed")
    cfg.quantization.quant_cfg = "int8"
    with pytest.raises(ConfigValidationError, match="both replace the Linear layers"):
        cfg.validate(world_size=1)
    cfg = tiny_llama_pretrain_config(mixed_precision="bf16_with_fp8_current_scaling_mixed", use_megatron_fsdp=True)
    with pytest.raises(ConfigValidationError, match="not with Megatron FSDP") as info:
        cfg.validate(world_size=1)
    assert "dist.use_megatron_fsdp" in info.value.paths


def test_plain_presets_never_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: object) -> None:
        raise AssertionError("probed")

    monkeypatch.setattr(packages, "cuda_capability", boom)
    cfg = tiny_llama_pretrain_config()
    cfg.mixed_precision = "bf16_mixed"
    cfg.validate(world_size=1)


def test_import_problem_catches_any_exception(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_engine_for_test.py").write_text("raise RuntimeError('cudnn shared object not found')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert packages.import_problem("broken_engine_for_test") == "RuntimeError: cudnn shared object not found"
    assert packages.import_problem("no_such_package_for_test") == "not installed"
    assert packages.import_problem("json") is None
    sys.modules.pop("broken_engine_for_test", None)


def test_version_at_least() -> None:
    assert packages.version_at_least("2.7.0.dev0+abc", "2.7.0")
    assert not packages.version_at_least("2.6.1", "2.7.0")
    assert not packages.version_at_least(None, "2.7.0")


def test_every_preset_is_listed_in_the_docs() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "training" / "low-precision.md").read_text()
    for name in MIXED_PRECISION_PRESETS:
        if "-" not in name:
            assert f"`{name}`" in doc, name
