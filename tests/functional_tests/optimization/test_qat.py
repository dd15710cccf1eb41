"""Quantization-aware training on 2 gloo ranks, every CPU format of nvidia-modelopt (one torchrun launch).

Per format: 4 AdamW steps train with finite, falling loss; a run stopped after 2 steps and resumed from its
checkpoint reproduces the uninterrupted run's losses bit for bit (the quantizers come back from modelopt_state.pt,
not from a new calibration); with quantization.disable_quantizers the run reproduces the unquantized run: the whole
run bit for bit for int8/fp8. SmoothQuant and AWQ fold per-channel scales into the weights, so with their quantizers
disabled the *model* is the unquantized one (first loss within FOLDED_LOSS_RTOL), but Adam's steps on the rescaled
weights differ (Adam is not invariant to that reparameterization), so only the first step is compared.
"""

from pathlib import Path

import pytest
import torch.distributed as dist

from megatron_bridge.config.model_optimization import CPU_QUANT_FORMATS
from megatron_bridge.training.pretrain import pretrain
from tests.functional_tests.launcher import TWO_RANKS, is_worker, join_launch_group
from tests.functional_tests.training._common import assert_finite_decreasing, small_config


pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

STEPS = 4
FOLDED_LOSS_RTOL = 1e-5
"""SmoothQuant/AWQ with disabled quantizers vs unquantized, first loss: the folded scales change rounding only."""
EXACT_FORMATS = ("int8", "fp8")


def _cfg(fmt: str | None, folder: Path | None = None, **overrides: object):  # noqa: ANN202
    cfg = small_config(**{"train_iters": STEPS, "micro_batch_size": 4, "seq_length": 32, "lr": 3e-3,
                          "lr_warmup_iters": 1, **overrides})
    cfg.quantization.quant_cfg = fmt
    cfg.quantization.calib_size = 4
    if folder is not None:
        cfg.checkpoint.save = cfg.checkpoint.load = str(folder)
        cfg.checkpoint.save_interval = 2
    return cfg


def _shared_dir(tmp_path: Path) -> Path:
    """Rank 0's temporary folder on every rank (each rank's pytest has its own tmp_path)."""
    box = [str(tmp_path)]
    dist.broadcast_object_list(box, src=0)
    return Path(box[0])


def _resume_is_exact(fmt: str, folder: Path, **overrides: object) -> list[float]:
    straight = pretrain(_cfg(fmt, **overrides)).losses
    first = _cfg(fmt, folder, **overrides)
    first.train.exit_interval = 2
    head = pretrain(first).losses
    tail = pretrain(_cfg(fmt, folder, **overrides)).losses
    assert head + tail == straight, (fmt, head, tail, straight)
    assert (folder / "iter_0000002" / "modelopt_state.pt").is_file()
    assert_finite_decreasing(straight)
    return straight


def test_qat_cpu_formats_train_resume_and_disable(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if not is_worker():
        TWO_RANKS.check(request)
        return
    join_launch_group()  # for the shared folder name; pretrain reuses the group
    root = _shared_dir(tmp_path)
    unquantized = pretrain(_cfg(None)).losses
    for fmt in CPU_QUANT_FORMATS:
        quantized = _resume_is_exact(fmt, root / fmt)
        assert quantized != unquantized, f"{fmt}: fake-quant changed nothing"
        disabled_cfg = _cfg(fmt)
        disabled_cfg.quantization.disable_quantizers = True
        disabled_cfg.train.exit_interval = STEPS if fmt in EXACT_FORMATS else 1
        disabled = pretrain(disabled_cfg).losses
        if fmt in EXACT_FORMATS:
            assert disabled == unquantized, (fmt, disabled, unquantized)
        else:
            assert disabled[0] == pytest.approx(unquantized[0], rel=FOLDED_LOSS_RTOL), (fmt, disabled, unquantized)
    _resume_is_exact("int8", root / "fsdp2", use_torch_fsdp2=True)
