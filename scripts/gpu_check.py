#!/usr/bin/env python3
"""Every GPU check in one call, within 10 minutes on one GPU, with one JSON summary.

    python scripts/gpu_check.py --wheels /path/to/wheels --output gpu_check.json   # on the GPU machine, offline
    python scripts/gpu_check.py --dry-run --output /tmp/gpu_check_plan.json        # CPU self-check of the plan

Steps, each with its own time budget inside a 570 s deadline (the budgets add up to it; a step that would overrun
gets what is left, and a step with no time left is recorded as skipped):

1. ``install``: the missing pure-Python dependencies at the pins of requirements/cpu.txt, from ``--wheels`` with
   ``pip install --no-index --find-links`` (no network there); the CUDA torch already installed is never replaced,
   and this checkout runs from ``src`` (PYTHONPATH).
2. ``gpu_tests``: ``pytest -m gpu tests`` - every GPU-marked test, among them the Megatron FSDP smoke
   (``test_fsdp_pretrain_basic``) and resume tests, reported one by one from the JUnit XML.
3. ``matrix``: 6 steps of the tiny recipe on one GPU for every mixed-precision preset (DDP), every backend (bf16),
   and every engine (``model.engine`` and ``model.transformer_impl``: native, megatron-core local spec, megatron-core
   TE spec; an engine this version or machine cannot build is skipped with its error), and the other families' tiny
   recipes (``FAMILY_CASES``: Mistral's window on both engines, Mixtral's experts, DeepSeek-V3's MLA, GPT-OSS's
   sinks, Gemma 3 and Gemma 2); each row
   compares the CUDA allocator peak with the dry-run memory estimate.
4. ``mfu``: a Llama-3-8B-shaped model (hidden 4096, 32/8 heads, SwiGLU 14336, vocabulary 128256, sequence 8192) in
   bf16 on one GPU with as many of its 32 blocks as the memory estimate fits into 85% of the GPU, 10 steps through
   ``scripts/performance/launch.py``; records MFU, tokens/s and where the GPU time went (kernel classes of a
   2-step profiler trace: GEMM, attention, optimizer, elementwise/other), which says what limits it, and its CUDA
   allocator peak against the estimate.
5. ``fp8``: two Llama-3-8B-shaped blocks (every Linear converts) trained 12 steps with ``-c bf16`` and with
   ``-c fp8_cs`` (torchao float8 on the local engine, FSDP2 with the FP8 all-gather, per-block ``torch.compile`` in
   both runs) through ``scripts/performance/launch.py``; the final losses agree within ``FP8_LOSS_RTOL`` and the
   summary records the median step times and their ratio (fp8 / bf16). Skipped below compute capability 8.9.
6. ``mcore_fp8``: the same two blocks on the megatron-core engine with the transformer-engine layer spec
   (megatron-core DDP and optimizer, no compile), ``-c bf16`` vs ``-c fp8_cs`` (transformer-engine FP8 current
   scaling in every layer): losses within ``FP8_LOSS_RTOL``, the step-time ratio recorded. Skipped below compute
   capability 8.9, or with validate()'s error where transformer-engine does not import.
7. ``cp_parity``: context parallelism, ring (``cp_comm_type="p2p"``) vs all-gather, when the config has
   ``model.cp_comm_type`` and 2 GPUs are present; skipped with the reason otherwise.

``--dry-run`` runs nothing: it validates every case's config on CPU, runs the steps' ``launch.py`` commands with
``--dryrun`` in its own process (``Runner.dry_launch``), sizes the MFU model for ``--gpu`` (default h200) with the
estimate, and writes the plan in the same JSON shape (a unit test runs it).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET  # noqa: N817  (our own pytest's JUnit file, not untrusted input)
from pathlib import Path
from typing import Any


REPO = Path(__file__).resolve().parents[1]
DEADLINE_S = 570
BUDGETS = {"install": 30, "gpu_tests": 170, "matrix": 80, "mfu": 110, "fp8": 70, "mcore_fp8": 60, "cp_parity": 50}
"""Seconds per step on the GPU, in running order; they add up to DEADLINE_S, so every step gets its budget (a unit
test checks the sum)."""
DRY_RUN_STEP_S = 300
"""``--dry-run`` is a CPU self-check of the plan, not timed against the GPU budgets: each step gets this long."""
REQUIRED = {"megatron-fsdp": "megatron_fsdp", "megatron-core": "megatron.core", "einops": "einops", "numpy": "numpy",
            "PyYAML": "yaml",
            "pytest": "pytest", "pytest-timeout": "pytest_timeout", "omegaconf": "omegaconf",
            "tensorboard": "tensorboard", "tokenizers": "tokenizers", "safetensors": "safetensors",
            "torchao": "torchao"}
"""pip name -> module of the dependencies the checks need (torch comes with the machine)."""
ENGINES = ("local", "megatron_core", "transformer_engine")
ENGINE_SETTINGS = {"local": ("native", "local"), "megatron_core": ("megatron_core", "local"),
                   "transformer_engine": ("megatron_core", "transformer_engine")}
"""Matrix engine name -> (model.engine, model.transformer_impl): the native model, megatron-core's GPTModel with the
local layer spec, and with transformer-engine's spec."""
ENGINE_PRESET = {"local": "bf16_mixed", "megatron_core": "bf16_mixed", "transformer_engine": "bf16_mixed"}
"""Preset of each engine's case: bf16_mixed everywhere (on megatron-core: bf16 weights, fp32 main parameters)."""
FAMILY_CASES = {"tiny_mistral": ("local", "megatron_core"), "tiny_mixtral": ("local",), "tiny_deepseek_v3": ("local",),
                "tiny_gpt_oss": ("local",), "tiny_gemma3": ("local",), "tiny_gemma2": ("local",)}
"""The other families' tiny recipes the matrix also trains (bf16, DDP): Mistral's sliding window on both engines
(megatron-core's local attention builds the window mask on the GPU), Mixtral's experts and DeepSeek-V3's multi-latent
attention with group-limited routing on the native engine (one GPU: expert parallelism 1; megatron-core refuses MLA,
rule megatron_core_mla), GPT-OSS's attention sinks (the sink-column path on CUDA) and clamped experts, Gemma 3's
per-layer RoPE and Gemma 2's soft-capped attention (megatron-core refuses those fields); the GPU-verified column of
docs/models.md is what such runs show."""
BACKENDS = ("ddp", "fsdp2", "megatron_fsdp")
MCORE_FSDP_PRESET = {"fsdp2": "bf16_mixed", "megatron_fsdp": "bf16_mixed"}
"""The preset of the matrix's megatron-core case per FSDP wrapper, bf16_mixed as Megatron-LM runs them: FSDP2 (bf16
weights and reduce-scatter, fp32 main parameters) and Megatron FSDP (bf16 compute weights in Float16Module, fp32 main
weights and gradient reduction in megatron-fsdp)."""
MFU_SHAPE = {"num_layers": 32, "seq_length": 8192}
FP8_SHAPE = {"num_layers": 2, "seq_length": 4096, "steps": 12}
"""The FP8 step: two Llama-3-8B blocks (hidden 4096, SwiGLU 14336: every Linear converts), 12 steps of 2 x 4096."""
FP8_LOSS_RTOL = 0.02
"""FP8 (torchao tensorwise, or transformer-engine current scaling on megatron-core; every layer) vs bf16: final losses
within 2 % after the short run."""
MCORE_FP8_SETTINGS = ("model.engine=megatron_core", "model.transformer_impl=transformer_engine")
"""The ``mcore_fp8`` step's engine: megatron-core's GPTModel with the transformer-engine layer spec (DDP)."""
MFU_GOAL = 0.55
"""The issue's goal for our engine on H100/H200-class GPUs (recorded beside the measurement, not enforced)."""
KERNEL_CLASSES = (("attention", r"flash|fmha|attention|sdpa"), ("gemm", r"gemm|cutlass|xmma|nvjet|cublas|sm90|sm100"),
                  ("optimizer", r"adam|multi_tensor|foreach"), ("communication", r"nccl"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wheels", default=None, help="folder of wheels to install missing dependencies from (offline)")
    p.add_argument("--output", default="gpu_check.json", help="the JSON summary")
    p.add_argument("--dry-run", action="store_true", help="validate and print the plan on CPU; run nothing")
    p.add_argument("--gpu", default="h200", help="GPU the dry run sizes the MFU model for")
    p.add_argument("--run-cases", nargs=2, metavar=("CASES", "OUT"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------ pure helpers
def missing_pins(requirements: Path, importable: Any) -> list[str]:
    """``name==version`` of every REQUIRED package whose module ``importable(module)`` says is missing."""
    pins = {}
    for line in requirements.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = f"{name.strip()}=={version.strip()}"
    return [pins.get(pkg.lower(), pkg) for pkg, module in REQUIRED.items() if not importable(module)]


def junit_outcomes(xml_text: str) -> dict[str, str]:
    """test id -> passed / failed / error / skipped, from pytest's JUnit XML."""
    out = {}
    for case in ET.fromstring(xml_text).iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
        out[name] = outcome
    return out


def kernel_breakdown(trace: dict[str, Any]) -> dict[str, float]:
    """Share of GPU kernel time per class (attention, gemm, optimizer, communication, other) in a Chrome trace."""
    totals: dict[str, float] = {}
    for ev in trace.get("traceEvents", []):
        if ev.get("cat") != "kernel":
            continue
        name = str(ev.get("name", "")).lower()
        cls = next((c for c, pattern in KERNEL_CLASSES if re.search(pattern, name)), "other")
        totals[cls] = totals.get(cls, 0.0) + float(ev.get("dur", 0.0))
    whole = sum(totals.values()) or 1.0
    return {c: round(t / whole, 4) for c, t in sorted(totals.items(), key=lambda kv: -kv[1])}


def matrix_cases() -> list[dict[str, str]]:
    """Every preset with DDP, every backend with bf16, every other engine with DDP, megatron-core's chunks with its
    FSDP wrappers (no duplicates)."""
    from megatron_bridge.config.mixed_precision import MIXED_PRECISION_PRESETS

    presets = sorted({n for n in MIXED_PRECISION_PRESETS if "-" not in n})
    cases = [{"engine": "local", "preset": p, "backend": "ddp"} for p in presets]
    cases += [{"engine": "local", "preset": "bf16_mixed", "backend": b} for b in BACKENDS if b != "ddp"]
    cases += [{"engine": e, "preset": ENGINE_PRESET[e], "backend": "ddp"} for e in ENGINES if e != "local"]
    cases += [{"engine": "megatron_core", "preset": MCORE_FSDP_PRESET[b], "backend": b}
              for b in BACKENDS if b != "ddp"]  # megatron-core's own FSDP wrappers (docs/training/engines.md)
    cases += [{"engine": e, "preset": "bf16_mixed", "backend": "ddp", "recipe": recipe}
              for recipe, engines in FAMILY_CASES.items() for e in engines]
    return cases


def case_config(case: dict[str, str], steps: int = 6):  # noqa: ANN201  (ConfigContainer)
    """The tiny recipe for one matrix case, validated; an engine this version or machine cannot build raises its
    named error (MissingDependencyError / ConfigValidationError)."""
    from megatron_bridge.models.validation import check_transformer_impl
    from megatron_bridge.recipes import get_recipe
    from megatron_bridge.recipes.perf import common_perf_overrides

    recipe = get_recipe(case.get("recipe", "tiny_llama")).fn
    moe = {"expert_model_parallel_size": 1} if recipe().model.is_moe else {}
    cfg = recipe(mixed_precision=case["preset"], use_megatron_fsdp=case["backend"] == "megatron_fsdp" or None, **moe)
    cfg = common_perf_overrides(cfg, train_iters=steps, warmup_iters=1)
    cfg.dist.use_torch_fsdp2 = case["backend"] == "fsdp2"
    cfg.model.engine, cfg.model.transformer_impl = ENGINE_SETTINGS[case["engine"]]
    if cfg.model.engine == "megatron_core":  # its provider builds on the device (no meta-device init)
        cfg.model.init_model_with_meta_device = False
    cfg.logger.log_progress = False
    cfg.validate(world_size=1)
    check_transformer_impl(cfg.model)
    return cfg


def mfu_config(num_layers: int):  # noqa: ANN201
    """The Llama-3-8B shape (recipe llama3_8b) with ``num_layers`` blocks, bf16, micro-batch 1, 2 per step."""
    from megatron_bridge.recipes import get_recipe

    cfg = get_recipe("llama3_8b").fn(seq_length=MFU_SHAPE["seq_length"], global_batch_size=2, micro_batch_size=1)
    cfg.model.num_layers = num_layers
    cfg.model.tensor_model_parallel_size = cfg.model.pipeline_model_parallel_size = 1
    cfg.model.context_parallel_size = 1
    cfg.mixed_precision = "bf16_mixed"
    return cfg


def mfu_layers(gpu_bytes: float, fraction: float = 0.85) -> tuple[int, int]:
    """The most blocks (<= 32) whose one-GPU estimate fits ``fraction`` of ``gpu_bytes``, and that estimate."""
    from megatron_bridge.perf.memory import estimate_memory

    best = (1, estimate_memory(mfu_config(1).validate(world_size=1), 1).peak_bytes)
    for n in range(2, MFU_SHAPE["num_layers"] + 1):
        peak = estimate_memory(mfu_config(n).validate(world_size=1), 1).peak_bytes
        if peak > fraction * gpu_bytes:
            break
        best = (n, peak)
    return best


# ------------------------------------------------------------------------------------------------------ runner
class Runner:
    """Runs steps against one deadline and collects their records."""

    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.start = time.monotonic()
        self.steps: dict[str, dict[str, Any]] = {}
        self.env = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                        PYTHONUNBUFFERED="1")

    def left(self) -> float:
        """Seconds left before the deadline."""
        return DEADLINE_S - (time.monotonic() - self.start)

    def step(self, name: str, fn: Any) -> None:
        """Run ``fn(timeout)`` with the step's budget (or what is left); record its result or error."""
        timeout = DRY_RUN_STEP_S if self.dry_run else min(BUDGETS[name], self.left())
        if timeout < 10:
            self.steps[name] = {"status": "skipped: no time left before the 10-minute deadline"}
            return
        t0 = time.monotonic()
        try:
            record = fn(timeout)
        except subprocess.TimeoutExpired:
            record = {"status": f"failed: timed out after {timeout:.0f} s"}
        except Exception as exc:  # a failed step is recorded, the others still run
            record = {"status": f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
        record["seconds"] = round(time.monotonic() - t0, 1)
        self.steps[name] = record
        print(f"gpu_check: {name}: {record['status']} ({record['seconds']} s)", flush=True)

    def run(self, cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
        """A subprocess in the repository root with ``src`` on PYTHONPATH."""
        return subprocess.run(cmd, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout)

    def dry_launch(self, cmd: list[str]) -> subprocess.CompletedProcess:
        """``cmd`` (a ``launch.py ... --dryrun`` command) run in this process: launch.py's own ``main`` parses the
        same arguments, builds and validates the same config and prints the same plan; a dry run starts nothing, so
        only the fresh interpreter is saved (it would import torch, and megatron-core for that engine, again for each
        of the dry run's six commands). Exit code and output come back as from :meth:`run`; the environment
        variables of the command's perf config are undone afterwards."""
        import contextlib
        import io

        from megatron_bridge.utils.cli import run_cli

        if Path(cmd[1]).name != "launch.py" or "--dryrun" not in cmd:
            raise ValueError(f"dry_launch runs launch.py dry runs only, not {' '.join(cmd[1:])}")
        out, err, env = io.StringIO(), io.StringIO(), dict(os.environ)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = run_cli(_launch_main(), cmd[2:])
        finally:
            os.environ.clear()
            os.environ.update(env)
        return subprocess.CompletedProcess(cmd, code, out.getvalue(), err.getvalue())


def _launch_main() -> Any:
    """``main`` of scripts/performance/launch.py (loaded once)."""
    import importlib.util

    module = sys.modules.get("_gpu_check_launch")
    if module is None:
        spec = importlib.util.spec_from_file_location("_gpu_check_launch", REPO / "scripts/performance/launch.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["_gpu_check_launch"] = module
    return module.main


def _found(module: str) -> bool:
    """Whether ``module`` can be found; a dotted name whose parent package is missing ("megatron.core") is not."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def install(r: Runner, wheels: str | None, timeout: float) -> dict[str, Any]:
    """Install the missing dependencies from the wheel folder (no index)."""
    missing = missing_pins(REPO / "requirements" / "cpu.txt", _found)
    if r.dry_run or not missing:
        return {"status": "ok" if not missing else "planned", "missing": missing, "wheels": wheels}
    if not wheels:
        return {"status": "failed: missing dependencies and no --wheels folder", "missing": missing}
    proc = r.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", wheels, *missing],
                 timeout)
    status = "ok" if proc.returncode == 0 else f"failed: pip: {proc.stderr.strip().splitlines()[-1:]}"
    return {"status": status, "installed": missing, "wheels": wheels}


def gpu_tests(r: Runner, out_dir: Path, timeout: float) -> dict[str, Any]:
    """Every GPU-marked test; per-test outcomes and the Megatron FSDP smoke/resume verdicts."""
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests", "-q", "-p", "no:cacheprovider",
           f"--junitxml={out_dir / 'gpu_tests.xml'}"]
    if r.dry_run:
        return {"status": "planned", "command": " ".join(cmd[1:])}
    proc = r.run(cmd, timeout)
    xml = out_dir / "gpu_tests.xml"
    tests = junit_outcomes(xml.read_text()) if xml.exists() else {}
    pick = lambda key: sorted({v for k, v in tests.items() if key in k}) or ["not found"]  # noqa: E731
    ok = proc.returncode == 0 and tests and all(v in ("passed", "skipped") for v in tests.values())
    return {"status": "ok" if ok else f"failed: pytest exit {proc.returncode}", "tests": tests,
            "megatron_fsdp_smoke": pick("test_fsdp_pretrain_basic"),
            "megatron_fsdp_resume": pick("resume"), "log_tail": proc.stdout[-2000:]}


def matrix(r: Runner, out_dir: Path, timeout: float) -> dict[str, Any]:
    """Every preset / backend / engine case, in one GPU process (``--run-cases``)."""
    cases = matrix_cases()
    if r.dry_run:
        rows = []
        for case in cases:
            try:
                case_config(case)
                rows.append({**case, "status": "planned"})
            except Exception as exc:  # an engine missing here is what the GPU run reports too
                rows.append({**case, "status": f"skipped: {str(exc).splitlines()[0][:200]}"})
        return {"status": "planned", "cases": rows}
    spec, out = out_dir / "cases.json", out_dir / "cases_out.json"
    spec.write_text(json.dumps(cases))
    proc = r.run([sys.executable, str(Path(__file__).resolve()), "--run-cases", str(spec), str(out)], timeout)
    rows = json.loads(out.read_text()) if out.exists() else []
    ok = proc.returncode == 0 and len(rows) == len(cases) and all(
        x["status"] == "ok" or x["status"].startswith("skipped") for x in rows)
    return {"status": "ok" if ok else "failed: see cases", "cases": rows, "log_tail": proc.stderr[-1500:]}


def run_cases(spec: str, out: str) -> int:
    """In one process: pretrain every case on the GPU, one row each (engines that cannot build are skipped)."""
    import math

    from megatron_bridge.errors import MegatronBridgeError
    from megatron_bridge.perf.memory import estimate_memory
    from megatron_bridge.training.pretrain import pretrain

    rows = []
    for case in json.loads(Path(spec).read_text()):
        row: dict[str, Any] = dict(case)
        try:
            cfg = case_config(case)
        except (MegatronBridgeError, ImportError) as exc:
            rows.append({**row, "status": f"skipped: {str(exc).splitlines()[0][:200]}"})
            continue
        try:
            result = pretrain(cfg)
            times = result.step_times[1:] or result.step_times
            ok = result.final_step == cfg.train.train_iters and math.isfinite(result.final_loss)
            est = estimate_memory(cfg, 1).peak_bytes
            row.update(status="ok" if ok else "failed: short run or non-finite loss", final_loss=result.final_loss,
                       s_per_step=sum(times) / len(times), peak_memory_gib=result.peak_memory_bytes / 2**30,
                       estimated_peak_gib=est / 2**30, estimate_error=est / max(result.peak_memory_bytes, 1) - 1)
        except Exception as exc:  # record and go on with the next case
            row["status"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        rows.append(row)
        Path(out).write_text(json.dumps(rows, indent=2))
    Path(out).write_text(json.dumps(rows, indent=2))
    return 0


def _refused_only_for_cuda(output: str) -> bool:
    """Whether a dry run's only complaint is the ring attention's need for CUDA (rule ``cp_ring_needs_cuda``)."""
    import re

    return set(re.findall(r"\[rule (\w+)\]", output)) == {"cp_ring_needs_cuda"}


def cp_parity(r: Runner, out_dir: Path, timeout: float) -> dict[str, Any]:
    """Ring vs all-gather context parallelism on 2 GPUs, when the config offers both."""
    from megatron_bridge.config.model import ModelConfig

    if "cp_comm_type" not in ModelConfig.__dataclass_fields__:
        return {"status": "skipped: model.cp_comm_type does not exist in this version (no ring/all-gather choice); "
                          "GPU-marked CP tests, if any, ran in gpu_tests"}
    import torch

    if not r.dry_run and torch.cuda.device_count() < 2:
        return {"status": "skipped: context parallelism needs 2 GPUs (NCCL allows one rank per GPU)"}
    losses = {}
    for kind in ("p2p", "all_gather"):
        run_dir = out_dir / f"cp_{kind}"
        cmd = [sys.executable, "scripts/performance/launch.py", "--recipe", "tiny_llama", "-ng", "2", "-cp", "2",
               "-ms", "5", "-c", "fp32", "--output_dir", str(run_dir), f"model.cp_comm_type={kind}"]
        proc = r.dry_launch([*cmd, "--dryrun"]) if r.dry_run else r.run(cmd, timeout / 2)
        if r.dry_run and kind == "p2p" and _refused_only_for_cuda(proc.stderr + proc.stdout):
            continue  # the CPU running the dry run has no CUDA: validate() names exactly that, nothing else
        if proc.returncode != 0:
            return {"status": f"failed: {kind}: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}"}
        if not r.dry_run:
            losses[kind] = json.loads((run_dir / "results.json").read_text())["losses"]
    if r.dry_run:
        return {"status": "planned"}
    pairs = list(zip(losses["p2p"], losses["all_gather"], strict=False))
    diff = max((abs(a - b) / max(abs(b), 1e-9) for a, b in pairs), default=float("nan"))
    ok = len(pairs) == 5 and diff <= 1e-4
    return {"status": "ok" if ok else "failed: losses differ", "losses": losses, "max_rel_diff": diff}


def fp8_commands(out_dir: Path, engine: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """The bf16 and FP8 launch.py runs of the FP8 step (same model, data, steps and backend): FSDP2 with
    per-block compile on the native engine; with ``engine`` overrides (:data:`MCORE_FP8_SETTINGS`) megatron-core DDP."""
    name = "mcore_fp8" if engine else "fp8"
    backend = [] if engine else ["--use_torch_fsdp2", "true"]
    cmds = {}
    for dtype in ("bf16", "fp8_cs"):
        cmds[dtype] = [sys.executable, "scripts/performance/launch.py", "--recipe", "llama3_8b", "-ng", "1", "-c",
                       dtype, "-ms", str(FP8_SHAPE["steps"]), "-gb", "2", "-mb", "1", "-sl",
                       str(FP8_SHAPE["seq_length"]), "-tp", "1", "-pp", "1", "-cp", "1", *backend,
                       "--output_dir", str(out_dir / f"{name}_{dtype}"), f"model.num_layers={FP8_SHAPE['num_layers']}",
                       *(engine or ["fsdp2.enable_compile=true"])]
    return cmds


def _last_line(proc: subprocess.CompletedProcess) -> str:
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {proc.returncode}"


def fp8(r: Runner, out_dir: Path, timeout: float, engine: tuple[str, ...] = ()) -> dict[str, Any]:
    """bf16 vs FP8 on one GPU (torchao on the native engine; transformer-engine through megatron-core's TE spec with
    ``engine``): losses within FP8_LOSS_RTOL, step-time ratio recorded. On megatron-core a config validate() refuses
    on this machine (no transformer-engine) is skipped with its error; the dry run accepts that refusal on a CPU."""
    cmds = fp8_commands(out_dir, engine)
    refusals = ("[rule fp8_requirements]", "[rule transformer_impl_available]") if engine else \
        ("[rule fp8_requirements]",)
    if r.dry_run:
        record: dict[str, Any] = {"commands": {k: " ".join(v[1:]) for k, v in cmds.items()}}
        for dtype, cmd in cmds.items():  # the configs build; on a CPU the FP8 (and TE) ones name what they lack
            proc = r.dry_launch([*cmd, "--dryrun"])
            may_refuse = engine or dtype == "fp8_cs"
            if proc.returncode != 0 and not (may_refuse and any(x in proc.stderr for x in refusals)):
                return {"status": f"failed: {dtype}: {_last_line(proc)}"}
            if proc.returncode != 0:
                record.setdefault("refused_on_this_machine", {})[dtype] = _last_line(proc)
        return {"status": "planned", **record}
    import torch

    capability = torch.cuda.get_device_capability(0)
    if capability < (8, 9):
        return {"status": f"skipped: FP8 needs compute capability >= 8.9 (this GPU: {capability[0]}.{capability[1]})"}
    results = {}
    for dtype, cmd in cmds.items():
        proc = r.run(cmd, timeout / 2)
        path = Path(cmd[cmd.index("--output_dir") + 1]) / "results.json"
        if proc.returncode != 0 and engine and any(x in proc.stderr for x in refusals):
            return {"status": f"skipped: {dtype}: {_last_line(proc)[:300]}"}
        if proc.returncode != 0 or not path.exists():
            return {"status": f"failed: {dtype}: {_last_line(proc)}"}
        results[dtype] = json.loads(path.read_text())
    bf16, fp8_run = results["bf16"], results["fp8_cs"]
    loss_diff = abs(fp8_run["final_loss"] - bf16["final_loss"]) / abs(bf16["final_loss"])
    ok = loss_diff <= FP8_LOSS_RTOL
    return {"status": "ok" if ok else f"failed: final losses differ by {loss_diff:.4f} > {FP8_LOSS_RTOL}",
            "bf16_final_loss": bf16["final_loss"], "fp8_final_loss": fp8_run["final_loss"],
            "loss_rel_diff": loss_diff, "loss_rtol": FP8_LOSS_RTOL, "bf16_median_step_s": bf16["median_step_time_s"],
            "fp8_median_step_s": fp8_run["median_step_time_s"],
            "step_time_ratio_fp8_over_bf16": fp8_run["median_step_time_s"] / bf16["median_step_time_s"],
            "bf16_peak_memory_gib": bf16["peak_memory_gib"], "fp8_peak_memory_gib": fp8_run["peak_memory_gib"]}


def mfu(r: Runner, out_dir: Path, gpu: str, timeout: float) -> dict[str, Any]:
    """MFU of the 8B-shaped model on one GPU in bf16; kernel-time classes say what limits it."""
    from megatron_bridge.perf.estimate import GPU_MEMORY_GIB, gpu_key

    if r.dry_run:
        gpu_bytes, device = GPU_MEMORY_GIB[gpu_key(gpu)] * 2**30, gpu_key(gpu)
    else:
        import torch

        gpu_bytes, device = torch.cuda.get_device_properties(0).total_memory, torch.cuda.get_device_name(0)
    layers, est = mfu_layers(gpu_bytes)
    run_dir = out_dir / "mfu"
    cmd = [sys.executable, "scripts/performance/launch.py", "--recipe", "llama3_8b", "-ng", "1", "-c", "bf16",
           "-ms", "10", "-gb", "2", "-mb", "1", "-sl", str(MFU_SHAPE["seq_length"]), "-tp", "1", "-pp", "1",
           "-cp", "1", "--output_dir", str(run_dir), f"model.num_layers={layers}",
           "profiling.use_pytorch_profiler=true", "profiling.profile_step_start=7", "profiling.profile_step_end=9",
           f"profiling.trace_dir={run_dir / 'trace'}"]
    record: dict[str, Any] = {"device": device, "num_layers": layers, "estimated_peak_gib": est / 2**30,
                              "command": " ".join(cmd[1:])}
    if r.dry_run:
        return {"status": "planned", **record}
    t0 = time.monotonic()
    proc = r.run(cmd, timeout)
    if proc.returncode != 0 and "out of memory" in (proc.stderr + proc.stdout).lower() and layers > 1:
        layers //= 2  # the estimate was too low for this GPU: say so, and measure with half the blocks
        record.update(num_layers=layers, oom_at_estimate=True)
        cmd[cmd.index(next(c for c in cmd if c.startswith("model.num_layers=")))] = f"model.num_layers={layers}"
        proc = r.run(cmd, max(10.0, timeout - (time.monotonic() - t0)))
    results = run_dir / "results.json"
    if proc.returncode != 0 or not results.exists():
        return {"status": f"failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}", **record}
    res = json.loads(results.read_text())
    trace = run_dir / "trace" / "trace_rank0.json"
    record.update(mfu=res["mfu"], tokens_per_s=res["tokens_per_s_per_device"],
                  tflops_per_s=res["model_tflops_per_s_per_device"], median_step_s=res["median_step_time_s"],
                  peak_memory_gib=res["peak_memory_gib"], final_loss=res["final_loss"],
                  estimate_error=record["estimated_peak_gib"] / max(res["peak_memory_gib"], 1e-9) - 1,
                  kernel_time_share=kernel_breakdown(json.loads(trace.read_text())) if trace.exists() else None,
                  goal_mfu=MFU_GOAL, meets_goal=res["mfu"] is not None and res["mfu"] >= MFU_GOAL)
    return {"status": "ok", **record}


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = parse_args(argv)
    if args.run_cases:
        return run_cases(*args.run_cases)
    sys.path.insert(0, str(REPO / "src"))
    r = Runner(args.dry_run)
    out_dir = Path(args.output).resolve().parent / "gpu_check_work"
    if not args.dry_run:
        out_dir.mkdir(parents=True, exist_ok=True)
    r.step("install", lambda t: install(r, args.wheels, t))
    r.step("gpu_tests", lambda t: gpu_tests(r, out_dir, t))
    r.step("matrix", lambda t: matrix(r, out_dir, t))
    r.step("mfu", lambda t: mfu(r, out_dir, args.gpu, t))
    r.step("fp8", lambda t: fp8(r, out_dir, t))
    r.step("mcore_fp8", lambda t: fp8(r, out_dir, t, MCORE_FP8_SETTINGS))
    r.step("cp_parity", lambda t: cp_parity(r, out_dir, t))
    ok = all(s["status"] in ("ok", "planned") or s["status"].startswith("skipped") for s in r.steps.values())
    summary = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "dry_run": args.dry_run, "ok": ok,
               "seconds": round(time.monotonic() - r.start, 1), "steps": r.steps}
    Path(args.output).write_text(json.dumps(summary, indent=2))
    print(f"gpu_check: {'all passed' if ok else 'FAILURES'}; summary in {args.output}")
    return 0 if ok else 1


if __name__ == "__main__":
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
