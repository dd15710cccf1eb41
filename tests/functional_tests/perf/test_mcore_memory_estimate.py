"""The megatron-core engine's memory estimate (src/megatron_bridge/engines/megatron_core/memory.py) against the bytes
megatron-core really allocates, on CPU through the test-only harness (tests/functional_tests/mcore_cpu_harness.py).

One plain Python process (no torchrun; the harness is process-wide, so not this pytest process; forked from the fork
server, tests/functional_tests/forkserver.py) runs ``pretrain()`` for one step of the functional tests' megatron-core
config per case — ``GPTModel`` (in ``Float16Module`` with bf16), megatron-core DDP, its FSDP2 wrapper or its Megatron
FSDP adapter, and ``get_megatron_optimizer``, all through this library's set-up code — and counts the unique storages
(local shards of DTensors) of the model's parameters after the step, of the gradients as the optimizer step starts
(``main_grad``: views of DDP's ``grad_data`` buffer; FSDP2's ``grad`` shards, freed by the step) and of the optimizer's
parameters and state after the step (Adam state exists) that are not parameters. The test compares them with
``estimate_memory`` of the same validated config, each within ±15%; under megatron-core DDP and FSDP2 weights and
gradients exactly, optimizer state exactly but for torch Adam's per-tensor ``step`` scalars (which the estimate leaves
out).
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from megatron_bridge.perf.measure import storage_bytes
from tests.functional_tests.launcher import fork_server_env


REPO = Path(__file__).resolve().parents[3]
MODULE = "tests.functional_tests.perf.test_mcore_memory_estimate"
"""This file as a module: its ``__main__`` is the measuring process."""
TOLERANCE = 0.15
CASES: dict[str, dict[str, Any]] = {
    "bf16": {"mixed_precision": "bf16_mixed"},
    "bf16_distributed_optimizer": {"mixed_precision": "bf16_mixed", "optimizer.use_distributed_optimizer": True},
    "bf16_grads_in_bf16": {"mixed_precision": None, "optimizer.bf16": True, "model.params_dtype": "bfloat16",
                           "ddp.grad_reduce_in_fp32": False},  # no preset: the presets reduce in fp32
    "fp32": {"mixed_precision": "fp32"},
    "fsdp2_bf16": {"mixed_precision": "bf16_mixed", "dist.use_torch_fsdp2": True},
    "fsdp2_fp32": {"mixed_precision": "fp32", "dist.use_torch_fsdp2": True},
    "megatron_fsdp_bf16": {"mixed_precision": "bf16_mixed", "dist.use_megatron_fsdp": True,
                           "ddp.data_parallel_sharding_strategy": "optim_grads_params"},
}
"""Case → overrides of the functional tests' megatron-core config (one rank, one step; untied embeddings, as
megatron-core's FSDP2 wrapper requires)."""
EXACT = ("bf16", "bf16_distributed_optimizer", "bf16_grads_in_bf16", "fp32", "fsdp2_bf16", "fsdp2_fp32")
"""Cases whose state the estimate counts exactly (Megatron FSDP pads its buffers)."""

pytestmark = [
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU harness test (megatron-core runs natively on CUDA)"),
]


def _params(ctx: Any) -> list[torch.nn.Parameter]:
    return [p for chunk in ctx.backend.chunks for p in chunk.parameters()]


def grad_bytes(ctx: Any) -> int:
    """Bytes of the gradients (``main_grad`` buffers, else ``grad``) as the optimizer step starts."""
    params = _params(ctx)
    grads = [g for p in params for g in (getattr(p, "main_grad", None), p.grad) if g is not None]
    return sum(storage_bytes(grads).values())


def measure(ctx: Any, grads: int) -> dict[str, Any]:
    """Bytes of the parameters and the optimizer's own tensors of ``ctx`` after the step; ``grads`` as measured."""
    params = storage_bytes(_params(ctx))
    inner = getattr(ctx.optimizer, "chained_optimizers", [ctx.optimizer])
    state = [v for o in inner for s in o.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    main = [p for o in inner for group in o.optimizer.param_groups for p in group["params"]]
    optimizer = {k: v for k, v in storage_bytes(main + state).items() if k not in params}
    scalars = sum(v.untyped_storage().nbytes() for v in state if v.numel() == 1)
    return {"params": sum(params.values()), "grads": grads, "optimizer": sum(optimizer.values()),
            "step_scalars": scalars, "optimizer_class": type(inner[0]).__name__}


def worker(out: str) -> None:
    """Run every case for one step in this process and write measured and estimated bytes to ``out``."""
    from megatron_bridge.engines.megatron_core import parallel_state
    from megatron_bridge.perf.memory import estimate_memory
    from megatron_bridge.training.callbacks import Callback
    from megatron_bridge.training.pretrain import pretrain
    from tests.functional_tests.mcore_cpu_harness import install_fsdp
    from tests.functional_tests.training.test_megatron_core_engine import mcore_config

    class Count(Callback):
        """Gradient bytes as the optimizer step starts (its ``step`` wrapped), the rest at the end."""

        def on_train_start(self, ctx: Any) -> None:
            step = ctx.optimizer.step

            def counted_step(*args: Any, **kwargs: Any) -> Any:
                self.grads = grad_bytes(ctx)
                return step(*args, **kwargs)

            ctx.optimizer.step = counted_step

        def on_train_end(self, ctx: Any) -> None:
            self.record = measure(ctx, self.grads)

    install_fsdp()
    rows = {}
    for case, overrides in CASES.items():
        preset = overrides["mixed_precision"]
        rest = {k: v for k, v in overrides.items() if k != "mixed_precision"}
        cfg = mcore_config(mixed_precision=preset, **{"train.train_iters": 1, "train.global_batch_size": 2,
                                                   "model.share_embeddings_and_output_weights": False, **rest})
        est = estimate_memory(cfg.validate(world_size=1), 1)
        probe = Count()
        try:
            pretrain(cfg, callbacks=[probe])
        finally:
            parallel_state.destroy()
        rows[case] = {"measured": probe.record, "estimate": {"params": est.param_bytes, "grads": est.grad_bytes,
                                                             "optimizer": est.optimizer_bytes}}
    Path(out).write_text(json.dumps(rows))


@pytest.mark.timeout(120)
def test_estimate_matches_megatron_core_bytes(tmp_path: Path) -> None:
    out = tmp_path / "bytes.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", **fork_server_env()}  # forked warm (forkserver.py), else cold
    cmd = [sys.executable, "-m", "tests.functional_tests.forkserver", MODULE, str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert set(rows) == set(CASES)
    classes = {case: row["measured"]["optimizer_class"] for case, row in rows.items()}
    f16 = "Float16OptimizerWithFloat16Params"
    assert classes == {"bf16": f16, "bf16_distributed_optimizer": "DistributedOptimizer", "bf16_grads_in_bf16": f16,
                       "fp32": "FP32Optimizer", "fsdp2_bf16": f16, "fsdp2_fp32": "FP32Optimizer",
                       "megatron_fsdp_bf16": "DistributedOptimizer"}
    for case, row in rows.items():
        measured, est = row["measured"], row["estimate"]
        print(f"[mcore-memory] {case}: measured {measured}, estimate {est}")
        for part in ("params", "grads", "optimizer"):
            assert abs(est[part] - measured[part]) <= TOLERANCE * measured[part], (case, part, measured, est)
        if case in EXACT:
            assert (est["params"], est["grads"]) == (measured["params"], measured["grads"]), (case, measured, est)
            assert est["optimizer"] == measured["optimizer"] - measured["step_scalars"], (case, measured, est)
    n = rows["fp32"]["measured"]["params"] // 4
    assert rows["bf16"]["measured"]["params"] == 2 * n and rows["bf16"]["measured"]["grads"] == 4 * n
    assert rows["bf16_grads_in_bf16"]["measured"]["grads"] == 2 * n
    assert rows["fsdp2_bf16"]["measured"]["grads"] == 2 * n  # no MixedPrecisionPolicy: bf16 gradients
    assert rows["fsdp2_bf16"]["measured"]["optimizer"] >= 12 * n


if __name__ == "__main__":
    worker(sys.argv[1])
