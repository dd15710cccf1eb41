"""Export of a quantization-aware-trained checkpoint as a modelopt file (one process): the restored model is the
quantized model of the checkpoint, and a checkpoint without quantization is refused with a named error."""

import subprocess
from pathlib import Path

import pytest
import torch

from megatron_bridge.errors import CheckpointError
from megatron_bridge.optimization.export import load_quantized_model, restore_exported
from megatron_bridge.training.pretrain import pretrain
from tests.functional_tests.launcher import warm_python
from tests.functional_tests.training._common import small_config


pytestmark = pytest.mark.timeout(300)

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "checkpoint" / "export_quantized.py"


def test_export_restores_the_quantized_model(tmp_path: Path) -> None:
    pytest.importorskip("modelopt.torch.quantization")
    cfg = small_config(train_iters=2, micro_batch_size=8, seq_length=32, lr_warmup_iters=1)
    cfg.quantization.quant_cfg, cfg.quantization.calib_size = "fp8", 4
    cfg.checkpoint.save = str(tmp_path / "ckpt")
    pretrain(cfg)
    python, env = warm_python()  # forked warm from the suite's fork server where it has one
    proc = subprocess.run([python, str(SCRIPT), str(tmp_path / "ckpt"), str(tmp_path / "model.pth")],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model, model_cfg = load_quantized_model(tmp_path / "ckpt")
    restored = restore_exported(model_cfg, tmp_path / "model.pth")
    ids = torch.randint(0, model_cfg.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    assert type(restored.layers[0].mlp.down_proj).__name__ == "QuantLinear"
    assert torch.equal(restored(ids), model(ids))


def test_export_refuses_an_unquantized_checkpoint(tmp_path: Path) -> None:
    cfg = small_config(train_iters=2, micro_batch_size=8, seq_length=32, lr_warmup_iters=1)
    cfg.checkpoint.save = str(tmp_path / "ckpt")
    pretrain(cfg)
    with pytest.raises(CheckpointError, match="modelopt_state.pt"):
        load_quantized_model(tmp_path / "ckpt")
