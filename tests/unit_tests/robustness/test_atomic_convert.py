"""The converter never overwrites an existing output without --overwrite and never leaves a half-written one."""

import pytest
import torch

from megatron_bridge.bridge import convert
from megatron_bridge.errors import CheckpointError
from tests.unit_tests.checkpoint.toy import build_run, tiny_cfg


def test_existing_output_needs_overwrite_and_a_failure_leaves_it_intact(tmp_path, monkeypatch):
    root = tmp_path / "ckpt"
    build_run(tiny_cfg(save=str(root))).manager.save()
    dst = tmp_path / "weights.pt"
    dst.write_bytes(b"previous export")
    with pytest.raises(CheckpointError, match="already exists: pass --overwrite"):
        convert.convert_weights(root, dst, "torch")

    def half_written(weights, path):  # noqa: ANN001, ANN202
        path.write_bytes(b"half")
        raise OSError("killed mid-write")

    monkeypatch.setattr(convert, "write_torch_weights", half_written)
    with pytest.raises(OSError, match="killed mid-write"):
        convert.convert_weights(root, dst, "torch", overwrite=True)
    assert dst.read_bytes() == b"previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "weights.pt"]  # no temporary left behind
    monkeypatch.undo()

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "stale.txt").write_text("old")
    convert.convert_weights(root, hf, "hf", overwrite=True)
    names = {p.name for p in hf.iterdir()}
    assert "stale.txt" not in names and {"config.json", "model.safetensors"} <= names  # replaced as a whole
    assert convert.convert_weights(root, dst, "torch", overwrite=True) == dst
    assert "model" in torch.load(dst, weights_only=True)
