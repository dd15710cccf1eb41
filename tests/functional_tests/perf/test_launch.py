"""`scripts/performance/launch.py --recipe tiny_llama -ng 2 -ms 20` runs on CPU and writes results.json + plot."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.functional_tests.launcher import forked_workers_env


REPO = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(300)
def test_launch_tiny_two_ranks_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "scripts/performance/launch.py", "--recipe", "tiny_llama", "-ng", "2", "-ms", "20",
         "--output_dir", str(out)],  # launch.py and its agent start cold, the workers fork warm (launcher.py)
        cwd=REPO, env={**os.environ, **forked_workers_env()}, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last_line = proc.stdout.strip().splitlines()[-1]
    assert last_line.startswith("SUMMARY backend=ddp world=2 device=cpu")
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == 2 and results["steps"] == 20 and len(results["step_times_s"]) == 20
    assert results["tokens_per_s_per_device"] > 0 and results["model_tflops_per_s_per_device"] > 0
    assert results["mfu"] is None  # no peak for CPUs
    assert math.isfinite(results["final_loss"]) and results["final_loss"] < results["losses"][0]
    assert (out / "results.png").stat().st_size > 1000

    again = subprocess.run([sys.executable, "scripts/performance/launch.py", "--compare", str(out / "results.json"),
                            str(out / "results.json")], cwd=REPO, capture_output=True, text=True, check=True)
    assert "1.000" in again.stdout


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.timeout(120)
@pytest.mark.skipif(_cuda(), reason="the CPU answer of the bare command")
def test_bare_megatron_fsdp_command_on_cpu_says_its_world_size_and_names_the_cpu_flag(tmp_path: Path) -> None:
    """The design's `launch.py --use_megatron_fsdp true`, nothing else: the defaults in one line, then the named
    refusal (megatron-fsdp has no CPU code path) with the flag that runs here, before any process starts."""
    proc = subprocess.run([sys.executable, "scripts/performance/launch.py", "--use_megatron_fsdp", "true",
                           "--output_dir", str(tmp_path / "run")],
                          cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=110)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "recipe tiny_llama" in lines[0] and "world size 1 (-ng 1)" in lines[0]
    assert "--use_megatron_fsdp true needs CUDA GPUs" in proc.stderr and "--use_torch_fsdp2 true" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(180)
def test_launch_without_ng_runs_the_smallest_world_size_to_results(tmp_path: Path) -> None:
    """No -ng: one line names the chosen world size (tiny_llama's layout: 1), and the run writes its results."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "scripts/performance/launch.py", "--recipe", "tiny_llama",
                           "--use_torch_fsdp2", "true", "-ms", "3", "--output_dir", str(out)],
                          cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    said = [line for line in proc.stdout.splitlines() if line.startswith("launch.py: ")]
    assert len(said) == 1 and "world size 1 (-ng 1), the smallest recipe tiny_llama's layout" in said[0]
    results = json.loads((out / "results.json").read_text())
    assert results["steps"] == 3 and results["world_size"] == 1 and results["backend"] == "fsdp2"
