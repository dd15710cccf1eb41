"""pretrain() on 2 gloo ranks with DDP and FSDP2: finite, decreasing loss and parity with one process.

Run by plain pytest (which launches torchrun) or directly:
    python -m torch.distributed.run --nproc_per_node=2 -m pytest \
        tests/functional_tests/training/test_pretrain_backends.py::test_ddp_pretrain_basic -v -s
Parity tolerance (fp32, 8 AdamW steps on the same global batch of 8 samples): losses within 1e-5 relative, weights
within 2e-5 absolute. The distributed runs differ from the reference only in float summation order.
"""

from pathlib import Path

import pytest

from megatron_bridge.training.pretrain import pretrain
from tests.functional_tests.launcher import is_worker, launch
from tests.functional_tests.training._common import (
    FullWeights,
    assert_finite_decreasing,
    assert_matches_reference,
    run_reference,
    small_config,
)


LOSS_RTOL = 1e-5
WEIGHT_ATOL = 2e-5

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """Single-process run of the same config (computed once, in the launching process only)."""
    if is_worker():
        return None
    return run_reference(small_config(), tmp_path_factory.mktemp("reference"))


def _run_and_compare(use_fsdp2: bool) -> None:
    cfg = small_config(use_torch_fsdp2=use_fsdp2)
    weights = FullWeights()
    result = pretrain(cfg, callbacks=[weights])
    assert result.world_size == 2
    assert result.backend == ("fsdp2" if use_fsdp2 else "ddp")
    assert result.final_step == 8 and result.exit_reason == "train_iters"
    assert_finite_decreasing(result.losses)
    assert_matches_reference(result, weights.weights, loss_rtol=LOSS_RTOL, weight_atol=WEIGHT_ATOL,
                             label=f"backend={result.backend}")

def test_ddp_pretrain_basic(reference: Path | None) -> None:
    if not is_worker():
        launch(f"{__file__}::test_ddp_pretrain_basic", env={"MB_REFERENCE": str(reference)})
        return
    _run_and_compare(use_fsdp2=False)


def test_fsdp2_pretrain_basic(reference: Path | None) -> None:
    if not is_worker():
        launch(f"{__file__}::test_fsdp2_pretrain_basic", env={"MB_REFERENCE": str(reference)})
        return
    _run_and_compare(use_fsdp2=True)
