#!/usr/bin/env bash
# GPU smoke test of the three data-parallel backends (DDP, FSDP2, Megatron FSDP) on one CUDA machine, in one call.
#
#   bash scripts/gpu_smoke.sh            # from the repository root
#
# 1. Finds a Python whose torch is a CUDA build ($PYTHON, default python3) and never replaces that torch: a venv
#    with --system-site-packages ($VENV, default .venv-gpu; USE_VENV=0, or a $PYTHON that already lives in a venv,
#    uses $PYTHON directly), this package on
#    PYTHONPATH (plus an editable --no-deps install when pip can do it offline), and only the missing pure-Python
#    dependencies at the pins of requirements/cpu.txt (WHEELHOUSE=dir installs them from local wheels, no index;
#    a machine without network typically needs only: pip download --no-deps -d DIR megatron-fsdp==0.6.1 einops==0.8.2).
# 2. Trains the tiny Llama 10 steps (bf16 mixed precision) with each backend through pretrain() on
#    min(2, GPUs) ranks (one rank per GPU; with one GPU the single-rank variants run).
# 3. Runs the GPU-marked functional tests (pytest -m gpu tests/functional_tests), among them the Megatron FSDP smoke
#    test of docs/training/megatron-fsdp.md; SMOKE_TESTS=0 skips this part.
# Prints a table (backend, ranks, steps, final loss, s/step, status) and exits non-zero if anything failed.
# GPU_SMOKE_ALLOW_CPU=1 dry-runs the script itself on a CPU machine (DDP/FSDP2 pass, Megatron FSDP fails by design).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv-gpu}
STEPS=${STEPS:-10}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

if [ "${GPU_SMOKE_ALLOW_CPU:-0}" != 1 ] && \
        ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_smoke: '$PYTHON' has no CUDA build of torch (check: $PYTHON -c 'import torch; print(torch.cuda.is_available())')."
    echo "gpu_smoke: run on a CUDA machine, or set PYTHON to an interpreter with a CUDA torch. Never install"
    echo "           transformer-engine on a CPU machine (docs/installation.md)."
    exit 2
fi
NGPU=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')
NPROC=$(( NGPU >= 2 ? 2 : 1 ))
[ "$NGPU" = 0 ] && NPROC=2  # GPU_SMOKE_ALLOW_CPU=1: a dry run of this script on CPU (Megatron FSDP must fail there)

# ------------------------------------------------------------------------------------------------- environment
PY="$PYTHON"
IN_VENV=$("$PYTHON" -c 'import sys; print(int(sys.prefix != sys.base_prefix))')
if [ "${USE_VENV:-1}" = 1 ] && [ "$IN_VENV" = 0 ]; then  # a venv inside a venv would not see its torch
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv --system-site-packages "$VENV" || exit 2
    if "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
        PY="$VENV/bin/python"
    else
        echo "gpu_smoke: $VENV does not see $PYTHON's torch; using $PYTHON directly"
    fi
fi
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || true  # PYTHONPATH covers it
pins() {  # "pkg:module" specs whose module does not import -> their pins from requirements/cpu.txt
    for spec in "$@"; do
        pkg=${spec%%:*}; mod=${spec##*:}
        if ! "$PY" -c "import $mod" >/dev/null 2>&1; then
            pin=$(grep -i "^$pkg==" requirements/cpu.txt || true)
            echo "${pin:-$pkg}"
        fi
    done
}
pip_install() {
    if [ -n "${WHEELHOUSE:-}" ]; then
        "$PY" -m pip install -q --no-index --find-links "$WHEELHOUSE" "$@"
    else
        "$PY" -m pip install -q "$@"
    fi
}
# needed by pretrain() and the tests; the rest of the pinned dependencies only by paths the smoke test avoids
mapfile -t required < <(pins megatron-fsdp:megatron_fsdp einops:einops numpy:numpy PyYAML:yaml pytest:pytest \
                                 pytest-timeout:pytest_timeout)
mapfile -t optional < <(pins omegaconf:omegaconf tensorboard:tensorboard tokenizers:tokenizers safetensors:safetensors)
if [ ${#required[@]} -gt 0 ]; then
    echo "gpu_smoke: installing missing dependencies: ${required[*]}"
    pip_install "${required[@]}" || { echo "gpu_smoke: pip failed (offline? WHEELHOUSE=dir of wheels)"; exit 2; }
fi
if [ ${#optional[@]} -gt 0 ]; then
    pip_install "${optional[@]}" >/dev/null 2>&1 || echo "gpu_smoke: (not needed here, not installed: ${optional[*]})"
fi
"$PY" - <<'EOF'
import importlib.metadata as md, torch
v = md.version("megatron-fsdp")
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
print(f"gpu_smoke: torch {torch.__version__} (CUDA {torch.version.cuda}), {torch.cuda.device_count()} GPU(s) "
      f"{gpu}, megatron-fsdp {v}")
if v != "0.6.1":
    print("gpu_smoke: WARNING megatron-fsdp 0.6.1 is the tested version (docs/installation.md)")
EOF

# ------------------------------------------------------------------------------------------- pretrain per backend
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cat > "$WORK/driver.py" <<'EOF'
"""Worker: 10 bf16 steps of the tiny Llama with one backend; rank 0 writes a JSON row."""
import json, math, os, sys, traceback

backend, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
row = {"backend": backend, "ranks": int(os.environ.get("WORLD_SIZE", "1")), "steps": 0,
       "final_loss": float("nan"), "s_per_step": float("nan"), "status": "FAIL"}
try:
    from megatron_bridge.recipes import tiny_llama_pretrain_config
    from megatron_bridge.training.gpt_step import forward_step
    from megatron_bridge.training.pretrain import pretrain

    cfg = tiny_llama_pretrain_config(
        train_iters=steps, global_batch_size=16, micro_batch_size=2, eval_interval=None, log_interval=1,
        mixed_precision="bf16_mixed", lr_warmup_iters=min(2, max(steps - 1, 0)), use_torch_fsdp2=backend == "fsdp2",
        use_megatron_fsdp=True if backend == "megatron_fsdp" else None)
    cfg.checkpoint.save = cfg.checkpoint.load = None
    cfg.logger.tensorboard_dir = None
    result = pretrain(cfg, forward_step)
    times = result.step_times[1:] or result.step_times
    row.update(steps=result.final_step, final_loss=result.final_loss, s_per_step=sum(times) / len(times),
               backend=result.backend)
    ok = result.final_step == steps and math.isfinite(result.final_loss)
    row["status"] = "PASS" if ok else "FAIL: non-finite loss or short run"
except Exception as exc:  # report, then fail the job
    traceback.print_exc()
    row["status"] = f"FAIL: {type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}"
if int(os.environ.get("RANK", "0")) == 0:
    with open(out, "w") as f:
        json.dump(row, f)
sys.stdout.flush()
os._exit(0 if row["status"] == "PASS" else 1)
EOF

FAILED=0
for backend in ddp fsdp2 megatron_fsdp; do
    echo "gpu_smoke: pretrain with $backend on $NPROC rank(s) ..."
    # --standalone: torch's agent binds a free port itself (a port picked here and released could be taken first)
    if ! timeout "$STEP_TIMEOUT" "$PY" -m torch.distributed.run --standalone --nproc_per_node="$NPROC" \
            "$WORK/driver.py" "$backend" "$WORK/$backend.json" "$STEPS" \
            > "$WORK/$backend.log" 2>&1; then
        FAILED=1
        echo "gpu_smoke: $backend failed; last lines of its log:"
        tail -n 25 "$WORK/$backend.log"
    fi
done

# ------------------------------------------------------------------------------------------- GPU-marked tests
if [ "${SMOKE_TESTS:-1}" = 1 ]; then
    echo "gpu_smoke: pytest -m gpu tests/functional_tests ..."
    if ! timeout $((STEP_TIMEOUT * 3)) "$PY" -m pytest -m gpu tests/functional_tests -q -rA -p no:cacheprovider \
            > "$WORK/pytest.log" 2>&1; then
        FAILED=1
        tail -n 40 "$WORK/pytest.log"
    fi
fi

# --------------------------------------------------------------------------------------------------- the table
"$PY" - "$WORK" "$NPROC" "$STEPS" <<'EOF'
import json, os, re, sys

work, nproc, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = []
for backend in ("ddp", "fsdp2", "megatron_fsdp"):
    path = os.path.join(work, f"{backend}.json")
    if os.path.exists(path):
        rows.append(json.load(open(path)))
    else:
        rows.append({"backend": backend, "ranks": nproc, "steps": 0, "final_loss": float("nan"),
                     "s_per_step": float("nan"), "status": "FAIL: no result (see the log above)"})
log = os.path.join(work, "pytest.log")
if os.path.exists(log):
    for line in open(log):
        m = re.match(r"^(PASSED|FAILED|ERROR|SKIPPED)\s+(?:\[\d+\]\s+)?(\S+)", line)
        if m:
            name = m.group(2).split("/")[-1]
            rows.append({"backend": "pytest " + name[:60], "ranks": nproc, "steps": "-", "final_loss": "-",
                         "s_per_step": "-", "status": "PASS" if m.group(1) == "PASSED" else m.group(1)})
fmt = lambda v, spec: format(v, spec) if isinstance(v, float) else str(v)
print(f"\n{'backend':<72} {'ranks':>5} {'steps':>5} {'final loss':>10} {'s/step':>8}  status")
for r in rows:
    print(f"{r['backend']:<72} {r['ranks']:>5} {r['steps']:>5} {fmt(r['final_loss'], '.4f'):>10} "
          f"{fmt(r['s_per_step'], '.4f'):>8}  {r['status']}")
EOF
[ "$FAILED" = 0 ] && echo "gpu_smoke: all passed" || echo "gpu_smoke: FAILURES above"
exit "$FAILED"
