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
from megatron_bridge.perf.args import bool_arg, build_config, build_parser, recipe_name
from megatron_bridge.perf.results import build_results, compare, peak_tflops, summary_line


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
    assert recipe_name(parser.parse_args(["--model", "llama3", "--size", "70b"])) == "llama3_70b"
    assert recipe_name(parser.parse_args(["--recipe", "tiny_llama"])) == "tiny_llama"
    assert recipe_name(parser.parse_args([])) == "llama3_8b"
    with pytest.raises(ConfigValidationError, match="--model and --size go together"):
        recipe_name(parser.parse_args(["--model", "llama3"]))


def test_perf_overrides_and_flags() -> None:
    cfg = _cfg("--recipe", "tiny_llama", "-ms", "20", "-gb", "32", "-mb", "2", "-sl", "64", "-c", "bf16")
    assert cfg.train.train_iters == 20 and cfg.scheduler.lr_decay_iters == 20
    assert cfg.checkpoint.save is None and cfg.logger.log_interval == 1
    assert cfg.ddp.check_for_nan_in_grad is False and cfg.validation.eval_interval is None
    assert (cfg.train.global_batch_size, cfg.train.micro_batch_size, cfg.model.seq_length) == (32, 2, 64)
    assert cfg.dataset.seq_length == 64 and cfg.mixed_precision == "bf16_mixed"
    assert cfg.scheduler.lr_warmup_iters == 10


def test_key_value_overrides_win_over_flags() -> None:
    cfg = _cfg("--recipe", "tiny_llama", "-gb", "32", "train.global_batch_size=64", "train.train_iters=7")
    assert cfg.train.global_batch_size == 64 and cfg.train.train_iters == 7


def test_megatron_fsdp_flag_applies_parity_overrides() -> None:
    cfg = _cfg("--use_megatron_fsdp", "true")
    assert cfg.ddp.use_megatron_fsdp and cfg.dist.use_megatron_fsdp
    assert cfg.ddp.data_parallel_sharding_strategy == "optim_grads_params"
    assert cfg.ddp.keep_fp8_transpose_cache is False and cfg.ddp.average_in_collective is False
    assert cfg.model.init_model_with_meta_device and cfg.checkpoint.load is None
    assert cfg.checkpoint.ckpt_format == "fsdp_dtensor"
    cfg.validate(world_size=1)


def test_activation_checkpointing_and_offloading_flags() -> None:
    assert _cfg("--recipe", "tiny_llama", "--activation_checkpointing", "yes").model.recompute_granularity == "full"
    cfg = _cfg("--recipe", "tiny_llama", "--cpu_offloading", "2")
    assert cfg.model.cpu_offloading and cfg.model.cpu_offloading_num_layers == 2


def test_fp8_is_a_named_error() -> None:
    with pytest.raises(ConfigValidationError, match="--compute_dtype fp8_cs needs transformer-engine"):
        _cfg("-c", "fp8_cs")


def test_dryrun_prints_validated_megatron_fsdp_yaml() -> None:
    out = subprocess.run([sys.executable, "scripts/performance/launch.py", "--use_megatron_fsdp", "true", "--dryrun"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    data = yaml.safe_load(out)
    assert data["ddp"]["use_megatron_fsdp"] is True and data["dist"]["use_megatron_fsdp"] is True
    assert data["ddp"]["data_parallel_sharding_strategy"] == "optim_grads_params"
    assert data["checkpoint"]["ckpt_format"] == "fsdp_dtensor"


def test_results_mfu_and_compare(tmp_path: Path) -> None:
    cfg = _cfg("--recipe", "tiny_llama", "-c", "bf16")
    run = SimpleNamespace(step_times=[1.0, 1.0, 1.0, 0.5, 0.5], world_size=2, tokens_per_step=1000,
                          flops_per_step=989e12, backend="ddp", peak_memory_bytes=2**30,
                          losses=[3.0, 2.0, 1.0, 0.9, 0.8], final_loss=0.8)
    res = build_results(cfg, run, device_name="NVIDIA H100 80GB HBM3")
    assert res["median_step_time_s"] == 0.5 and res["tokens_per_s_per_device"] == 1000
    assert res["model_tflops_per_s_per_device"] == pytest.approx(989.0)
    assert res["mfu"] == pytest.approx(1.0)
    assert "MFU=100.0%" in summary_line(res)
    cpu = build_results(cfg, run, device_name=None)
    assert cpu["mfu"] is None and cpu["peak_tflops_per_device"] is None
    table = compare(res, {**res, "median_step_time_s": 1.0})
    assert "median_step_time_s" in table and "2.000" in table
    json.dumps(res)


def test_peak_table_prefers_longest_match() -> None:
    assert peak_tflops("NVIDIA H200", "bfloat16") == 989.0
    assert peak_tflops("NVIDIA GB200", "bfloat16") == 2500.0
    assert peak_tflops(None, "bfloat16") is None
    assert peak_tflops("Some GPU", "bfloat16") is None
