"""Streaming: converting a model of more than 4 shards holds less than 2 shards' worth of tensors at once.

Measured with :class:`TensorMeter`: every tensor the Bridge materializes is counted from its creation until
Python frees it (weakref finalizers), so a tensor kept anywhere — reader cache, shard writer, DCP — stays counted.
A negative control (reading the whole folder into a dict) shows the meter sees a non-streaming read.
"""

import json

import torch

from megatron_bridge import AutoBridge
from megatron_bridge.bridge.convert import read_hf_folder
from megatron_bridge.bridge.memory import TensorMeter


SHARD = 200_000


def _big_hf_folder(folder):  # noqa: ANN001, ANN202
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=12, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=500)
    LlamaForCausalLM(config).save_pretrained(folder, max_shard_size=SHARD)
    shards = sorted(folder.glob("model-*.safetensors"))
    total = json.loads((folder / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
    return shards, total


def test_import_and_export_stream_under_two_shards(tmp_path) -> None:  # noqa: ANN001
    shards, total = _big_hf_folder(tmp_path / "hf")
    assert len(shards) > 4
    shard_bytes = max(p.stat().st_size for p in shards)

    with TensorMeter().measure() as meter:
        AutoBridge.import_ckpt(tmp_path / "hf", tmp_path / "ck")
    assert meter.tracked > 50 and 0 < meter.peak_bytes < 2 * shard_bytes, (meter.peak_bytes, shard_bytes)

    with TensorMeter().measure() as meter:
        out = AutoBridge.export_ckpt(tmp_path / "ck", tmp_path / "out", max_shard_size=SHARD)
    assert len(list(out.glob("model-*.safetensors"))) > 4
    assert meter.tracked > 50 and 0 < meter.peak_bytes < 2 * shard_bytes, (meter.peak_bytes, shard_bytes)

    with TensorMeter().measure() as meter:  # negative control: the whole model at once
        weights = read_hf_folder(tmp_path / "hf")
    assert meter.peak_bytes >= 0.9 * total > 4 * shard_bytes
    del weights
