"""scripts/gpu_check.py on CPU: its --dry-run self-check and its pure helpers (the GPU run itself needs a GPU)."""

import json
import subprocess
from pathlib import Path

from megatron_bridge.config.mixed_precision import MIXED_PRECISION_PRESETS
from tests.functional_tests.launcher import warm_python
from tests.unit_tests.scripts import load_script


REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "gpu_check.py"


def _module():  # noqa: ANN202
    return load_script(SCRIPT)


def test_dry_run_plans_every_check(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    python, env = warm_python()  # forked warm from the suite's fork server where it has one
    proc = subprocess.run([python, str(SCRIPT), "--dry-run", "--gpu", "h100", "--output", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads(out.read_text())
    assert plan["dry_run"] is True and plan["ok"] is True
    steps = plan["steps"]
    assert list(steps) == ["install", "gpu_tests", "matrix", "mfu", "fp8", "mcore_fp8", "cp_parity"]
    for name in ("fp8", "mcore_fp8"):
        fp8 = steps[name]
        assert fp8["status"] == "planned" and "-c fp8_cs" in fp8["commands"]["fp8_cs"]
        assert "-c bf16" in fp8["commands"]["bf16"]
        assert fp8["commands"]["bf16"].replace("-c bf16", "") == fp8["commands"]["fp8_cs"].replace("-c fp8_cs", "") \
            .replace(f"{name}_fp8_cs", f"{name}_bf16")  # the same run but for the dtype (and its output folder)
        refused = fp8.get("refused_on_this_machine", {})
        assert "bf16" not in refused or name == "mcore_fp8", refused  # bf16 on the native engine runs anywhere
        assert all("[rule fp8_requirements]" in v or "[rule transformer_impl_available]" in v
                   for v in refused.values()), refused
    mcore = steps["mcore_fp8"]["commands"]["fp8_cs"]
    assert "model.engine=megatron_core model.transformer_impl=transformer_engine" in mcore
    assert "--use_torch_fsdp2" not in mcore  # megatron-core DDP
    assert "-m gpu tests" in steps["gpu_tests"]["command"]
    cases = steps["matrix"]["cases"]
    presets = {n for n in MIXED_PRECISION_PRESETS if "-" not in n}
    assert {c["preset"] for c in cases if c["backend"] == "ddp" and c["engine"] == "local"} == presets
    assert {c["backend"] for c in cases} == {"ddp", "fsdp2", "megatron_fsdp"}
    assert {c["engine"] for c in cases} == {"local", "megatron_core", "transformer_engine"}
    assert {c["preset"] for c in cases if c["engine"] != "local" and c["backend"] == "ddp"} == {"bf16_mixed"}
    assert [c["preset"] for c in cases if c["engine"] == "megatron_core" and c["backend"] == "fsdp2"] == [
        "bf16_mixed"]
    assert [c["preset"] for c in cases if c["engine"] == "megatron_core" and c["backend"] == "megatron_fsdp"] == [
        "bf16_mixed"]
    assert all(c["status"] == "planned" or c["status"].startswith("skipped: ") for c in cases)
    families = {(c["recipe"], c["engine"]): c["status"] for c in cases if "recipe" in c}
    assert families == {("tiny_mistral", "local"): "planned", ("tiny_mistral", "megatron_core"): "planned",
                        ("tiny_mixtral", "local"): "planned", ("tiny_deepseek_v3", "local"): "planned",
                        ("tiny_gpt_oss", "local"): "planned", ("tiny_gemma3", "local"): "planned",
                        ("tiny_gemma2", "local"): "planned"}
    mfu = steps["mfu"]
    assert mfu["device"] == "H100" and 1 <= mfu["num_layers"] <= 32
    assert mfu["estimated_peak_gib"] <= 0.85 * 79.6
    assert "--recipe llama3_8b" in mfu["command"] and "-c bf16" in mfu["command"]


def test_step_budgets_fit_the_deadline() -> None:
    gc = _module()
    assert sum(gc.BUDGETS.values()) <= gc.DEADLINE_S, gc.BUDGETS


def test_helpers_parse_junit_traces_and_pins(tmp_path: Path) -> None:
    gc = _module()
    xml = ('<testsuites><testsuite><testcase classname="a.T" name="test_ok"/><testcase classname="a.T" '
           'name="test_bad"><failure message="x"/></testcase><testcase classname="b" name="test_skip"><skipped/>'
           '</testcase></testsuite></testsuites>')
    assert gc.junit_outcomes(xml) == {"a.T::test_ok": "passed", "a.T::test_bad": "failed", "b::test_skip": "skipped"}
    trace = {"traceEvents": [{"cat": "kernel", "name": "sm90_xmma_gemm_bf16", "dur": 60.0},
                             {"cat": "kernel", "name": "pytorch_flash::flash_fwd_kernel", "dur": 30.0},
                             {"cat": "kernel", "name": "multi_tensor_apply_kernel<Adam>", "dur": 5.0},
                             {"cat": "kernel", "name": "elementwise_kernel", "dur": 5.0},
                             {"cat": "cpu_op", "name": "aten::mm", "dur": 1000.0}]}
    assert gc.kernel_breakdown(trace) == {"gemm": 0.6, "attention": 0.3, "optimizer": 0.05, "other": 0.05}
    req = tmp_path / "req.txt"
    req.write_text("# pins\ntorch==2.13.0\neinops==0.8.2\nmegatron-fsdp==0.6.1\n")
    missing = gc.missing_pins(req, lambda module: module not in ("einops", "megatron_fsdp"))
    assert missing == ["megatron-fsdp==0.6.1", "einops==0.8.2"]
