"""The streaming safetensors writer: files byte for byte as ``safetensors.save_file`` writes them, tensors in any
order, shards + index that load back exactly, named errors; and export memory that does not grow with the shard
size (peak resident anonymous memory of a subprocess exporting a ~160 MB model into one 5 GB shard)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron_bridge.bridge.hf_writer import SafetensorsShardWriter, TensorSpec
from megatron_bridge.errors import BridgeError


REPO = Path(__file__).resolve().parents[3]


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {"model.embed_tokens.weight": (11, 6), "model.layers.0.mlp.up_proj.weight": (9, 6),
              "model.layers.10.input_layernorm.weight": (6,), "lm_head.weight": (11, 6), "model.norm.weight": (6,)}
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def _writer(folder: Path, tensors: dict[str, torch.Tensor], dtype: torch.dtype, size: int | str = "5GB"):  # noqa: ANN202
    folder.mkdir()
    return SafetensorsShardWriter(folder, [TensorSpec(n, tuple(t.shape), dtype) for n, t in tensors.items()], size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_shard_is_byte_for_byte_save_file(dtype, tmp_path) -> None:  # noqa: ANN001
    from safetensors.torch import save_file

    tensors = _tensors()
    ref = tmp_path / "ref.safetensors"
    save_file({n: t.to(dtype) for n, t in tensors.items()}, str(ref), metadata={"format": "pt"})
    writer = _writer(tmp_path / "out", tensors, dtype)
    for name in reversed(list(tensors)):  # any order: each tensor goes to its planned offset
        writer.add(name, tensors[name])
    assert writer.finish() == ["model.safetensors"]
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == ref.read_bytes()


def test_shards_and_index_load_back_exactly(tmp_path) -> None:  # noqa: ANN001
    from safetensors import safe_open

    tensors = _tensors()
    writer = _writer(tmp_path / "out", tensors, torch.float32, size=300)  # bytes 264, 216, 24, 264, 24
    for name in sorted(tensors):
        writer.add(name, tensors[name])
    files = writer.finish()
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)] + ["model.safetensors.index.json"]
    index = json.loads((tmp_path / "out" / files[-1]).read_text())
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in tensors.values())
    shard_of = {name: int(file[10]) for name, file in index["weight_map"].items()}  # cut in the planned order
    assert shard_of == {"model.embed_tokens.weight": 1, "model.layers.0.mlp.up_proj.weight": 2,
                        "model.layers.10.input_layernorm.weight": 2, "lm_head.weight": 3, "model.norm.weight": 3}
    for name, file in index["weight_map"].items():
        with safe_open(str(tmp_path / "out" / file), framework="pt") as f:
            loaded = f.get_tensor(name)
            assert f.metadata() == {"format": "pt"}
        assert loaded.dtype == torch.float32 and torch.equal(loaded, tensors[name])


def test_wrong_tensors_are_named_errors(tmp_path) -> None:  # noqa: ANN001
    tensors = _tensors()
    writer = _writer(tmp_path / "out", tensors, torch.float32)
    writer.add("model.norm.weight", tensors["model.norm.weight"])
    with pytest.raises(BridgeError, match="'model.norm.weight' was exported twice"):
        writer.add("model.norm.weight", tensors["model.norm.weight"])
    with pytest.raises(BridgeError, match=r"'lm_head.weight' has shape \[10, 6\] but the export planned \[11, 6\]"):
        writer.add("lm_head.weight", tensors["lm_head.weight"][:10])
    with pytest.raises(BridgeError, match="'extra' is not one the export planned"):
        writer.add("extra", torch.zeros(1))
    with pytest.raises(BridgeError, match="never produced 4 tensor"):
        writer.finish()


_MEASURE = """
import json, sys, threading
from pathlib import Path
import torch
from megatron_bridge.bridge.exporting import write_hf_pretrained
from megatron_bridge.bridge.families import family_by_name
from megatron_bridge.bridge.weights import expected_shapes
from megatron_bridge.recipes.tiny import tiny_llama_pretrain_config

def anon():  # resident anonymous memory: tensors and heap, not the shared libraries' pages
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("RssAnon:"))
    return int(line.split()[1]) * 1024

config = tiny_llama_pretrain_config().model
config.num_layers, config.hidden_size, config.ffn_hidden_size, config.vocab_size = 12, 512, 1536, 1024
config.num_attention_heads, config.num_query_groups, config.params_dtype = 8, 8, "float32"
shapes = expected_shapes(config)
pairs = ((name, torch.ones(shape)) for name, shape in shapes.items())  # each made as the export asks for it
peak, done = [0], threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], anon())
        done.wait(0.002)
base = anon()
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
out = write_hf_pretrained(Path(sys.argv[1]), family_by_name("llama"), config, pairs)
done.set()
sampler.join()
print(json.dumps({"growth": max(peak[0], anon()) - base, "files": sorted(p.name for p in out.iterdir()),
                  "bytes": sum(torch.Size(s).numel() * 4 for s in shapes.values())}))
"""


def test_export_memory_does_not_grow_with_the_shard(tmp_path) -> None:  # noqa: ANN001
    """A ~160 MB model written into one default (5 GB) shard: the old writer held the whole shard (growth >= the
    model), the streaming one holds about a tensor (3 MB here)."""
    result = subprocess.run([sys.executable, "-c", _MEASURE, str(tmp_path / "out")], capture_output=True, text=True,
                            cwd=REPO, timeout=600, check=False,
                            env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"})
    assert result.returncode == 0, result.stderr[-2000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert "model.safetensors" in measured["files"] and measured["bytes"] > 150e6
    assert measured["growth"] < 0.25 * measured["bytes"], measured
