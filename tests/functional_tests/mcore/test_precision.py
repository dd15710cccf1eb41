"""Mixed precision on the megatron-core engine (Megatron-Bridge's ``bf16_mixed``/``fp16_mixed``) on CPU/gloo, through
the test-only harness (tests/functional_tests/mcore_cpu_harness.py).

* One process: ``bf16_mixed`` trains with bf16 weights in ``Float16Module``, fp32 ``main_grad`` buffers
  (``ddp.grad_reduce_in_fp32``) and fp32 main parameters and Adam state in ``Float16OptimizerWithFloat16Params``;
  its per-step losses stay within :data:`BF16_VS_FP32_RTOL` of the fp32 run's (same initial weights: megatron-core
  initialises in fp32, then casts), and so do ``fp16_mixed``'s (megatron-core's dynamic loss scaler).
* Two processes: TP=2, and DP=2 with the distributed optimizer (fp32 main-parameter shards), match the one-process
  bf16 run within :data:`BF16_PARITY_RTOL` per step; PP=2 (bf16 activations between the stages, megatron-core's
  schedule scaling the loss through ``grad_scale_func``) stays within :data:`BF16_VS_FP32_RTOL` of fp32 at PP=2
  (PP=2 initialises its stages differently from one process, so its reference is the fp32 PP=2 run).

Tolerances: bf16 has an 8-bit mantissa (relative rounding 2^-8 ≈ 4e-3 per operation); losses are averages over 512
tokens and the weights are updated in fp32, so per-step losses move far less. Measured (2026-12-01, 2-core CPU VM):
bf16 vs fp32 at most 1.1e-4 relative over 8 steps, fp16 vs fp32 9.5e-6, TP=2 5.3e-5 and DP=2 1.9e-5 vs one process,
bf16 vs fp32 at PP=2 1.4e-4.

The tests of one process count share one torchrun launch (launcher.py's ``LaunchGroups``); the one-process group
writes the bf16 reference the two-process group reads. Skipped with CUDA (the harness replaces CUDA calls) and
without megatron-core.
"""

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from megatron_bridge.training.callbacks import Callback
from tests.functional_tests.launcher import LaunchGroups, is_worker, selected_groups


pytest.importorskip("megatron.core", reason="the megatron-core engine needs megatron-core (Python 3.12 environment)")

BF16_VS_FP32_RTOL = 2e-3
"""Per-step loss, bf16_mixed (and fp16_mixed) vs fp32, one process, 8 steps (measured 2026-12-04, the
harness computing bf16 products in fp32: ≤ 1.3e-4, the PP=2 pair the largest; fp16 6e-6)."""
BF16_PARITY_RTOL = 1e-3
"""Per-step loss, bf16_mixed at TP=2 or DP=2 vs one process (measured 2026-12-04: ≤ 2.8e-5)."""
GROUPS: dict[int, list[str]] = {
    1: ["test_bf16_one_process", "test_bf16_close_to_fp32", "test_fp16_close_to_fp32"],
    2: ["test_bf16_tp2_matches_one_process", "test_bf16_dp2_distributed_optimizer_matches_one_process",
        "test_bf16_pp2_close_to_fp32_pp2"],
}
"""Tests launched together, by process count (one launch each); the 1-process group runs first."""
LAUNCH_TIMEOUT_S = {1: 420, 2: 420}
REFERENCE = "bf16_reference.json"

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.timeout(900),
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU harness test (megatron-core runs natively on CUDA)"),
]


class PrecisionState(Callback):
    """At the end of training: the dtypes of the model weights, of megatron-core DDP's ``main_grad`` buffers, and of
    the optimizer's main parameters and state, with the optimizer classes."""

    def __init__(self) -> None:
        self.record: dict[str, Any] = {}

    def on_train_end(self, ctx: Any) -> None:
        model = ctx.backend.unwrap(ctx.backend.chunks[0])
        inner = getattr(ctx.optimizer, "chained_optimizers", [ctx.optimizer])
        main = [p for opt in inner for group in opt.optimizer.param_groups for p in group["params"]]
        state = [v for opt in inner for s in opt.optimizer.state.values() for v in s.values()
                 if torch.is_tensor(v) and v.numel() > 1]
        self.record = {
            "wrapper": type(ctx.backend.chunks[0].module).__name__,
            "model": sorted({str(p.dtype) for p in model.parameters()}),
            "main_grad": sorted({str(p.main_grad.dtype) for p in model.parameters()}),
            "optimizers": sorted({type(opt).__name__ for opt in inner}),
            "main_params": sorted({str(p.dtype) for p in main}),
            "state": sorted({str(v.dtype) for v in state}),
            "has_state": bool(state),
        }


def run(preset: str, **overrides: Any) -> tuple[list[float], dict[str, Any]]:
    """Worker: install the harness and train the functional tests' megatron-core config with ``preset`` on this
    launch's process group (kept alive between the tests of a shared launch; megatron-core's groups are not)."""
    from tests.functional_tests.mcore_cpu_harness import install, pretrain_in_launch
    from tests.functional_tests.training.test_megatron_core_engine import mcore_config

    install()
    probe = PrecisionState()
    cfg = mcore_config(mixed_precision=preset, **overrides)
    result = pretrain_in_launch(cfg, [probe])
    assert result.backend == "mcore_ddp" and result.final_step == cfg.train.train_iters
    return result.losses, probe.record


def assert_bf16_mixed(record: dict[str, Any], optimizer: str) -> None:
    """bf16 weights in Float16Module, fp32 gradient buffers, fp32 main parameters and optimizer state."""
    assert record["wrapper"] == "Float16Module", record
    assert record["model"] == ["torch.bfloat16"], record
    assert record["main_grad"] == ["torch.float32"], record
    assert record["optimizers"] == [optimizer], record
    assert record["main_params"] == ["torch.float32"] and record["state"] == ["torch.float32"], record
    assert record["has_state"], record


def assert_close(got: list[float], want: list[float], rtol: float, label: str) -> float:
    """Per-step losses within ``rtol`` (relative); returns the largest relative difference."""
    assert len(got) == len(want), (label, got, want)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, want, strict=True))
    assert worst <= rtol, f"{label}: max relative loss difference {worst:.2e} > {rtol}: {got} vs {want}"
    print(f"[mcore-precision] {label}: max relative loss difference {worst:.2e}")
    return worst


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The module's launches (launching process only), running the tests of each group this session selected."""
    if is_worker():
        return None
    groups = selected_groups(request, GROUPS)
    if any(groups[2]) and "test_bf16_one_process" not in groups[1]:
        groups[1] = ["test_bf16_one_process", *groups[1]]  # the two-process tests compare with its losses
    work = tmp_path_factory.mktemp("mcore_precision")
    return LaunchGroups(__file__, groups, LAUNCH_TIMEOUT_S, env={"MB_PRECISION_DIR": str(work)})


_LOSSES: dict[str, list[float]] = {}
"""Worker: losses of the runs of this launch, by preset (the later tests of the one-process group reuse them)."""


def _reference() -> list[float]:
    return json.loads((Path(os.environ["MB_PRECISION_DIR"]) / REFERENCE).read_text())["losses"]


def test_bf16_one_process(launches: LaunchGroups | None) -> None:
    """bf16_mixed on one process: Megatron-Bridge's meaning (bf16 weights, fp32 main parameters, fp32 reduction);
    writes the reference of the two-process tests."""
    if launches is not None:
        launches.check("test_bf16_one_process")
        return
    losses, record = run("bf16_mixed")
    assert_bf16_mixed(record, "Float16OptimizerWithFloat16Params")
    _LOSSES["bf16_mixed"] = losses
    (Path(os.environ["MB_PRECISION_DIR"]) / REFERENCE).write_text(json.dumps({"losses": losses}))


def test_bf16_close_to_fp32(launches: LaunchGroups | None) -> None:
    """bf16_mixed and fp32 from the same initial weights: per-step losses close, both falling."""
    if launches is not None:
        launches.check("test_bf16_close_to_fp32")
        return
    fp32, record = run("fp32")
    assert record["wrapper"] != "Float16Module" and record["model"] == ["torch.float32"], record
    assert record["optimizers"] == ["FP32Optimizer"], record
    _LOSSES["fp32"] = fp32
    bf16 = _LOSSES.get("bf16_mixed") or _reference()
    assert fp32[-1] < fp32[0] - 0.05 and bf16[-1] < bf16[0] - 0.05, (fp32, bf16)
    assert_close(bf16, fp32, BF16_VS_FP32_RTOL, "bf16_mixed vs fp32")


def test_fp16_close_to_fp32(launches: LaunchGroups | None) -> None:
    """fp16_mixed: fp16 weights, megatron-core's dynamic loss scaler, losses close to fp32's."""
    if launches is not None:
        launches.check("test_fp16_close_to_fp32")
        return
    losses, record = run("fp16_mixed")
    assert record["model"] == ["torch.float16"] and record["main_params"] == ["torch.float32"], record
    assert record["optimizers"] == ["Float16OptimizerWithFloat16Params"], record
    fp32 = _LOSSES.get("fp32") or run("fp32")[0]
    assert_close(losses, fp32, BF16_VS_FP32_RTOL, "fp16_mixed vs fp32")


def test_bf16_tp2_matches_one_process(launches: LaunchGroups | None) -> None:
    """bf16_mixed at TP=2 vs one process."""
    if launches is not None:
        launches.check("test_bf16_one_process")  # the reference
        launches.check("test_bf16_tp2_matches_one_process")
        return
    losses, record = run("bf16_mixed", **{"model.tensor_model_parallel_size": 2})
    assert_bf16_mixed(record, "Float16OptimizerWithFloat16Params")
    assert_close(losses, _reference(), BF16_PARITY_RTOL, "bf16_mixed TP=2 vs one process")


def test_bf16_dp2_distributed_optimizer_matches_one_process(launches: LaunchGroups | None) -> None:
    """bf16_mixed at DP=2 with the distributed optimizer (fp32 main-parameter shards) vs one process."""
    if launches is not None:
        launches.check("test_bf16_one_process")
        launches.check("test_bf16_dp2_distributed_optimizer_matches_one_process")
        return
    losses, record = run("bf16_mixed", **{"optimizer.use_distributed_optimizer": True,
                                          "ddp.use_distributed_optimizer": True})
    assert_bf16_mixed(record, "DistributedOptimizer")
    assert_close(losses, _reference(), BF16_PARITY_RTOL, "bf16_mixed DP=2 distributed optimizer vs one process")


def test_bf16_pp2_close_to_fp32_pp2(launches: LaunchGroups | None) -> None:
    """bf16_mixed at PP=2 (megatron-core's 1F1B schedule, Float16Module per stage) vs fp32 at PP=2."""
    if launches is not None:
        launches.check("test_bf16_pp2_close_to_fp32_pp2")
        return
    pp2 = {"model.pipeline_model_parallel_size": 2}
    bf16, record = run("bf16_mixed", **pp2)
    assert_bf16_mixed(record, "Float16OptimizerWithFloat16Params")
    fp32, _ = run("fp32", **pp2)
    assert fp32[-1] < fp32[0] - 0.05, fp32
    assert_close(bf16, fp32, BF16_VS_FP32_RTOL, "bf16_mixed PP=2 vs fp32 PP=2")
