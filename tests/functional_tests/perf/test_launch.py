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
