"""The performance launcher's flags, precedence, dry run and results helpers (no training here)."""

import argparse
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.perf.args import bool_arg, build_config, build_parser, environment, recipe_name
from megatron_bridge.perf.results import build_results, compare, join_slices, peak_tflops, summary_line


REPO = Path(__file__).resolve().parents[3]


def _cfg(*argv: str):  # noqa: ANN202
    return build_config(build_parser().parse_args(list(argv)))


@pytest.mark.parametrize(("text", "value"), [("true", True), ("1", True), ("YES", True), ("false", False),
                                             ("0", False), ("no", False)])
def test_bool_arg(text: str, value: bool) -> None:
    assert bool_arg(text) is value


def test_bool_arg_rejects_garbage() -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        bool_arg("maybe")


def test_recipe_selection() -> None:
    parser = build_parser()
    assert recipe_name(parser.parse_args(["-m", "llama", "-mr", "llama3_70b"])) == "llama3_70b"
    assert recipe_name(parser.parse_args(["--model_family_name", "qwen", "--model_recipe_name", "qwen3_8b"])) \
        == "qwen3_8b"
    assert recipe_name(parser.parse_args(["--recipe", "tiny_llama"])) == "tiny_llama"
    assert recipe_name(parser.parse_args([])) == "llama3_8b"
    with pytest.raises(ConfigValidationError, match="-m qwen does not match the recipe 'llama3_8b'"):
        recipe_name(parser.parse_args(["-m", "qwen", "-mr", "llama3_8b"]))
    with pytest.raises(ConfigValidationError, match="unknown recipe 'llama9'"):
        recipe_name(parser.parse_args(["-mr", "llama9"]))


def _parse_error(*argv: str, capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(list(argv))
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["-ng", "0"], "must be >= 1, got 0"),
    (["-ng", "-2"], "must be >= 1"),
    (["--num_gpus", "two"], "expected a whole number"),
    (["-tp", "0"], "must be >= 1"),
    (["--use_megatron_fsdp", "maybe"], "expected a boolean"),
    (["--use_meg", "true"], "unrecognized arguments: --use_meg"),  # abbreviations are refused
    (["--num_gpu", "2"], "unrecognized arguments: --num_gpu"),
    (["-x", "1"], "unrecognized arguments: -x"),
    (["-g", "k80"], "invalid choice: 'k80'"),
    (["-c", "int4"], "invalid choice: 'int4'"),
    (["-m", "gpt"], "invalid choice: 'gpt'"),
    (["-vp", "zero"], "expected a whole number"),
])
def test_malformed_flags_are_clear_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert message in _parse_error(*argv, capsys=capsys)


def test_stray_value_is_not_read_as_an_override() -> None:
    with pytest.raises(Exception, match="must look like 'section.key=value'"):
        _cfg("--recipe", "tiny_llama", "-tp", "2", "3")


def test_perf_overrides_and_flags() -> None:
    cfg = _cfg("--recipe", "tiny_llama", "-ms", "20", "-gb", "32", "-mb", "2", "-sl", "64", "-c", "bf16")
    assert cfg.train.train_iters == 20 and cfg.scheduler.lr_decay_iters == 20
    assert cfg.checkpoint.save is None and cfg.logger.log_interval == 1
    assert cfg.ddp.check_for_nan_in_grad is False and cfg.validation.eval_interval is None
    assert (cfg.train.global_batch_size, cfg.train.micro_batch_size, cfg.model.seq_length) == (32, 2, 64)
    assert cfg.dataset.seq_length == 64 and cfg.mixed_precision == "bf16_mixed"
    assert cfg.scheduler.lr_warmup_iters == 10


def test_flags_win_over_key_value_overrides() -> None:
    """Megatron-Bridge's default path applies the Hydra-style overrides first, then the flags."""
    cfg = _cfg("--recipe", "tiny_llama", "-gb", "32", "train.global_batch_size=64", "train.train_iters=7")
    assert cfg.train.global_batch_size == 32 and cfg.train.train_iters == 7


def test_tp_sets_sequence_parallel_and_vp_none() -> None:
    cfg = _cfg("-mr", "qwen3_8b", "-tp", "2", "-vp", "None", "-ng", "4")
    assert cfg.model.tensor_model_parallel_size == 2 and cfg.model.sequence_parallel is True
    assert cfg.dist.use_torch_fsdp2 is True  # TP runs on the FSDP2 backend here
    assert cfg.model.virtual_pipeline_model_parallel_size is None
    one = _cfg("-mr", "qwen3_8b", "-tp", "1", "-ng", "4")
    assert one.model.sequence_parallel is False and one.model.tensor_model_parallel_size == 1
    assert _cfg("-mr", "llama3_70b", "-vp", "2").model.virtual_pipeline_model_parallel_size == 2
    assert _cfg("-mr", "llama3_70b").model.virtual_pipeline_model_parallel_size == 5  # -vp not given


def test_per_gpu_perf_config_llama3_8b_h100_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """-g h100 selects Megatron-Bridge's flat recipe values: TP1 CP2, GBS 128, MBS 1, grad reduce in bf16."""
    cfg = _cfg("-m", "llama", "-mr", "llama3_8b", "-g", "h100", "-ng", "8", "-c", "bf16")
    m = cfg.model
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size) == (1, 1, 2)
    assert m.virtual_pipeline_model_parallel_size is None and m.sequence_parallel is False
    assert (cfg.train.global_batch_size, cfg.train.micro_batch_size) == (128, 1)
    cfg.finalize()
    assert cfg.ddp.grad_reduce_in_fp32 is False and cfg.optimizer.bf16
    args = build_parser().parse_args(["-mr", "llama3_8b", "-g", "h100", "-ng", "8"])
    env = environment(args, build_config(args))
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and env["TORCH_NCCL_HIGH_PRIORITY"] == "1"
    assert env["NVTE_FWD_LAYERNORM_SM_MARGIN"] == "20"
    recipe = _cfg("-mr", "llama3_8b", "-ng", "2")  # without -g: the recipe's own layout and batch
    assert recipe.model.context_parallel_size == 2 and recipe.train.global_batch_size == 512


def test_global_batch_weak_scales_with_num_gpus() -> None:
    assert _cfg("-mr", "llama3_8b", "-g", "h100", "-ng", "16").train.global_batch_size == 256  # DP 4 -> 8
    assert _cfg("-mr", "llama3_8b", "-g", "h100", "-ng", "4").train.global_batch_size == 64
    assert _cfg("-mr", "llama3_8b", "-g", "h100", "-ng", "16", "-gb", "128").train.global_batch_size == 128
    assert _cfg("-mr", "llama3_8b", "-ng", "4").train.global_batch_size == 1024  # recipe laid out for 2 GPUs
    assert _cfg("--recipe", "tiny_llama", "-ng", "2").train.global_batch_size == 16


def test_megatron_fsdp_flag_applies_parity_overrides() -> None:
    cfg = _cfg("--use_megatron_fsdp", "true")
    assert cfg.ddp.use_megatron_fsdp and cfg.dist.use_megatron_fsdp
    assert cfg.ddp.data_parallel_sharding_strategy == "optim_grads_params"
    assert cfg.ddp.keep_fp8_transpose_cache is False and cfg.ddp.average_in_collective is False
    assert cfg.model.init_model_with_meta_device and cfg.checkpoint.load is None
    assert cfg.checkpoint.ckpt_format == "fsdp_dtensor"
    assert cfg.model.context_parallel_size == 2  # llama3_8b keeps its CP: Megatron FSDP shards over dp × cp
    cfg.validate(world_size=2)
    args = build_parser().parse_args(["-g", "h100", "--use_megatron_fsdp", "t", "-ng", "8"])
    assert environment(args, build_config(args))["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"


def test_recompute_and_offloading_flags() -> None:
    cfg = _cfg("--recipe", "tiny_llama", "-rl", "2")
    assert (cfg.model.recompute_granularity, cfg.model.recompute_method, cfg.model.recompute_num_layers) == \
        ("full", "block", 2)
    assert _cfg("--recipe", "tiny_llama", "--recompute_modules", "core_attn").model.recompute_granularity == \
        "selective"
    with pytest.raises(ConfigValidationError, match="recomputes only \\['core_attn'\\]"):
        _cfg("--recipe", "tiny_llama", "--recompute_modules", "core_attn,mlp")
    cfg = _cfg("--recipe", "tiny_llama", "-ol", "2")
    assert cfg.model.cpu_offloading and cfg.model.cpu_offloading_num_layers == 2


# -c value -> (preset, fields that differ from it): Megatron-Bridge's scripts/performance/utils/precision.py
COMPUTE_DTYPE_MAPPING = {
    "bf16": ("bf16_mixed", {}),
    "fp16": ("fp16_mixed", {}),
    "fp32": ("fp32", {}),
    "fp8_cs": ("bf16_with_fp8_current_scaling_mixed", {"first_last_layers_bf16": False}),
    "fp8_mx": ("bf16_with_mxfp8_mixed", {}),
    "fp8_sc": ("bf16_with_fp8_subchannel_scaling_mixed", {}),
    "nvfp4": ("bf16_with_nvfp4_mixed", {}),
}


@pytest.mark.parametrize("dtype", sorted(COMPUTE_DTYPE_MAPPING))
def test_compute_dtype_selects_megatron_bridge_preset(dtype: str) -> None:
    from dataclasses import asdict

    from megatron_bridge.config.mixed_precision import get_mixed_precision_preset

    preset, changes = COMPUTE_DTYPE_MAPPING[dtype]
    mp = _cfg("--recipe", "tiny_llama", "-c", dtype).mixed_precision
    if not changes:
        assert mp == preset  # unchanged presets stay named in the YAML
        mp = get_mixed_precision_preset(mp)
    expected = asdict(get_mixed_precision_preset(preset))
    assert {k: v for k, v in asdict(mp).items() if expected[k] != v} == changes


def test_compute_dtype_choices_are_megatron_bridges_plus_cpu_dtypes() -> None:
    choices = next(a.choices for a in build_parser()._actions if a.dest == "compute_dtype")
    assert sorted(choices) == sorted(COMPUTE_DTYPE_MAPPING)


def test_fp8_compute_dtype_on_cpu_names_preset_and_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import megatron_bridge.utils.packages as packages

    monkeypatch.setattr(packages, "cuda_capability", lambda: None)
    cfg = _cfg("--recipe", "tiny_llama", "-c", "fp8_cs")
    with pytest.raises(ConfigValidationError, match="preset 'bf16_with_fp8_current_scaling_mixed' with changed") as e:
        cfg.validate(world_size=1)
    assert "a CUDA device" in str(e.value) and "fp8_recipe='tensorwise'" in str(e.value)


def test_perf_config_uses_the_same_mapping() -> None:
    from megatron_bridge.recipes.perf_configs import PerfConfig

    cfg = PerfConfig(num_gpus=8).apply(_cfg("--recipe", "tiny_llama"), "fp8_mx")
    assert cfg.mixed_precision.fp8_recipe == "mxfp8" and cfg.mixed_precision.grad_reduce_in_fp32 is False
    with pytest.raises(ConfigValidationError, match="--compute_dtype 'fp8_ds' is not one of"):
        PerfConfig(num_gpus=8).apply(_cfg("--recipe", "tiny_llama"), "fp8_ds")


def test_dryrun_prints_validated_megatron_fsdp_yaml() -> None:
    """llama3_8b with Megatron FSDP on 8 GPUs keeps the recipe's CP=2, and the estimate shards the state over the
    dp × cp = 8 ranks."""
    out = subprocess.run([sys.executable, "scripts/performance/launch.py", "-mr", "llama3_8b", "-ng", "8",
                          "--use_megatron_fsdp", "true", "--dryrun"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    data = yaml.safe_load(out)
    assert data["ddp"]["use_megatron_fsdp"] is True and data["dist"]["use_megatron_fsdp"] is True
    assert data["ddp"]["data_parallel_sharding_strategy"] == "optim_grads_params"
    assert data["checkpoint"]["ckpt_format"] == "fsdp_dtensor"
    assert data["model"]["context_parallel_size"] == 2
    assert "# layout: world 8 = tp 1 x pp 1 x cp 2 x dp 4" in out and "backend megatron_fsdp" in out
    assert "before data-parallel sharding (/8)" in out


def test_dryrun_of_a_folded_moe_layout_prints_the_expert_groups() -> None:
    """Issue 44: ``launch.py -mr qwen3_30b_a3b -ng 8 --dryrun`` runs Megatron-Bridge's 8-GPU layout (TP4 PP2 EP4,
    EP folded over the TP ranks) and its per-rank estimate names the folded expert groups."""
    out = subprocess.run([sys.executable, "scripts/performance/launch.py", "-mr", "qwen3_30b_a3b", "-ng", "8",
                          "--dryrun"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    data = yaml.safe_load(out)
    m = data["model"]
    assert (m["tensor_model_parallel_size"], m["pipeline_model_parallel_size"], m["expert_model_parallel_size"],
            m["expert_tensor_parallel_size"]) == (4, 2, 4, 1)
    assert "# layout: world 8 = tp 4 x pp 2 x cp 1 x dp 1 (ep 4, vp 1)" in out
    assert ("# experts: the 4 tp x cp x dp ranks of a stage fold as etp 1 x ep 4 x edp 1 (expert state reduced over "
            "edp; each TP rank routes 1/TP of the tokens)") in out
    assert "# per-rank memory (GiB)" in out and "peak" in out


def test_results_mfu_and_compare(tmp_path: Path) -> None:
    cfg = _cfg("--recipe", "tiny_llama", "-c", "bf16")
    run = SimpleNamespace(step_times=[1.0, 1.0, 1.0, 0.5, 0.5], world_size=2, tokens_per_step=1000,
                          flops_per_step=989e12, backend="ddp", peak_memory_bytes=2**30,
                          losses=[3.0, 2.0, 1.0, 0.9, 0.8], final_loss=0.8, steps=[1, 2, 3, 4, 5])
    res = build_results(cfg, run, device_name="NVIDIA H100 80GB HBM3")
    assert res["first_step"] == 1
    assert res["median_step_time_s"] == 0.5 and res["tokens_per_s_per_device"] == 1000
    assert res["model_tflops_per_s_per_device"] == pytest.approx(989.0)
    assert res["mfu"] == pytest.approx(1.0)
    assert "MFU=100.0%" in summary_line(res)
    cpu = build_results(cfg, run, device_name=None)
    assert cpu["mfu"] is None and cpu["peak_tflops_per_device"] is None
    table = compare(res, {**res, "median_step_time_s": 1.0})
    assert "median_step_time_s" in table and "2.000" in table
    json.dumps(res)


def test_join_slices_keeps_the_earlier_steps_of_a_resumed_run() -> None:
    earlier = {"recipe_digest": "d", "first_step": 1, "losses": [5.0, 4.0, 3.0], "step_times_s": [1.0, 1.0, 1.0]}
    later = {"recipe_digest": "d", "first_step": 3, "losses": [2.9, 2.0], "step_times_s": [0.5, 0.5], "steps": 2}
    joined = join_slices(earlier, later)
    assert joined["losses"] == [5.0, 4.0, 2.9, 2.0] and joined["step_times_s"] == [1.0, 1.0, 0.5, 0.5]
    assert joined["first_step"] == 1 and joined["steps"] == 4
    assert join_slices({**earlier, "recipe_digest": "other"}, later) is later  # another config's results
    assert join_slices({**earlier, "losses": [5.0]}, later) is later  # a gap: steps 2 unknown
    assert join_slices(earlier, {**later, "first_step": 1}) == {**later, "first_step": 1}  # a fresh run


def test_peak_table_prefers_longest_match() -> None:
    assert peak_tflops("NVIDIA H200", "bfloat16") == 989.0
    assert peak_tflops("NVIDIA GB200", "bfloat16") == 2500.0
    assert peak_tflops(None, "bfloat16") is None
    assert peak_tflops("Some GPU", "bfloat16") is None


@pytest.mark.parametrize("script,flag", [("scripts/training/run_recipe.py", "--nproc"),
                                         ("scripts/performance/launch.py", "-ng")])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_process_count_below_one_is_an_error(script: str, flag: str, value: str) -> None:
    """--nproc/-ng 0 is an error, never silently one process."""
    proc = subprocess.run([sys.executable, script, "--recipe", "tiny_llama", flag, value, "--dry-run"
                           if "run_recipe" in script else "--dryrun"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "must be >= 1" in proc.stderr and flag in proc.stderr
