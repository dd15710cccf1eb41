"""Bad input is a named BridgeError/CheckpointError, never silently dropped, and never leaves a partial output."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from megatron_bridge import AutoBridge
from megatron_bridge.bridge.rope import rope_fields_from_hf
from megatron_bridge.errors import BridgeError, CheckpointError
from tests.unit_tests.bridge.hf_models import hf_model


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:  # noqa: ANN001
    folder = tmp_path_factory.mktemp("good")
    hf_model("llama3").save_pretrained(folder, max_shard_size="20KB")
    return folder


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _first_shard(folder: Path) -> Path:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return folder / sorted(set(index["weight_map"].values()))[0]


def _truncate(folder: Path) -> None:
    shard = _first_shard(folder)
    shard.write_bytes(shard.read_bytes()[:-100])


def _add_tensor(folder: Path, name: str, tensor: torch.Tensor) -> None:
    shard = _first_shard(folder)
    tensors = load_file(str(shard))
    tensors[name] = tensor
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"][name] = shard.name
    index_path.write_text(json.dumps(index))


def _reshape(folder: Path, name: str) -> None:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = folder / index["weight_map"][name]
    tensors = load_file(str(shard))
    tensors[name] = tensors[name][:-1].clone()
    save_file(tensors, str(shard), metadata={"format": "pt"})


def _missing_shard(folder: Path) -> None:
    _first_shard(folder).unlink()


BREAKERS = {
    "unknown architecture": (lambda f: _edit_config(f, architectures=["GPT2LMHeadModel"]),
                             r"architecture \['GPT2LMHeadModel'\] is not supported"),
    "unknown rope_type": (lambda f: _edit_config(f, rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                                                                     "factor": 4.0}),
                          "rope_type='longrope' is not supported"),
    "yarn without its original length": (lambda f: _edit_config(f, rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}), r"rope_type 'yarn': missing \['original_max"),
    "unknown config key": (lambda f: _edit_config(f, sliding_window=128), r"does not know: \['sliding_window'\]"),
    "unsupported activation": (lambda f: _edit_config(f, hidden_act="gelu"), "hidden_act='gelu' is not supported"),
    "missing shard": (_missing_shard, "listed in .* is missing"),
    "truncated shard": (_truncate, "unreadable"),
    "unknown tensor": (lambda f: _add_tensor(f, "model.layers.0.mlp.extra.weight", torch.ones(2)),
                       r"does not know: \['model.layers.0.mlp.extra.weight'\]"),
    "mismatched shape": (lambda f: _reshape(f, "model.norm.weight"),
                         r"'model.norm.weight' has shape \[31\] but the config says \[32\]"),
    "missing tensor": (lambda f: _reshape_out(f), r"lacks 1 tensor\(s\) .*'model.norm.weight'"),
}


def _reshape_out(folder: Path) -> None:
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = folder / index["weight_map"].pop("model.norm.weight")
    tensors = load_file(str(shard))
    del tensors["model.norm.weight"]
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index_path.write_text(json.dumps(index))


@pytest.mark.parametrize("case", list(BREAKERS))
def test_bad_folders_are_named_errors_and_leave_no_output(case, good, tmp_path) -> None:  # noqa: ANN001
    folder = _copy(good, tmp_path / "bad")
    breaker, message = BREAKERS[case]
    breaker(folder)
    with pytest.raises(BridgeError, match=message):
        AutoBridge.import_ckpt(folder, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]  # no output, no hidden temporary folder


def test_bin_shard_with_code_is_refused(tmp_path) -> None:  # noqa: ANN001
    hf_model("llama3").save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    torch.save({**tensors, "evil": torch.nn.Linear(1, 1)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(BridgeError, match="weights_only=True refuses"):
        AutoBridge.from_hf_pretrained(tmp_path).to_megatron_model()


def test_rope_settings_are_read_or_refused() -> None:
    assert rope_fields_from_hf({"rope_theta": 5e5, "rope_scaling": None}) == {"rotary_base": 5e5,
                                                                               "rope_scaling": False}
    old_style = {"rope_theta": 5e5, "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 8192}}
    assert rope_fields_from_hf(old_style)["rope_scaling_factor"] == 8.0
    assert rope_fields_from_hf({})["rotary_base"] == 10000.0
    with pytest.raises(BridgeError, match="needs"):
        rope_fields_from_hf({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}})
    with pytest.raises(BridgeError, match="partial_rotary_factor"):
        rope_fields_from_hf({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}})
    with pytest.raises(BridgeError, match="per-layer-type"):
        rope_fields_from_hf({"rope_parameters": {"full_attention": {"rope_type": "default"}}})


def test_bad_arguments(good, tmp_path) -> None:  # noqa: ANN001
    assert AutoBridge.from_hf_pretrained(good, trust_remote_code=True).hf_path == Path(good)  # a permission only
    with pytest.raises(BridgeError, match="local Hugging Face folders only"):
        AutoBridge.from_hf_pretrained("meta-llama/Llama-3.2-1B")
    with pytest.raises(BridgeError, match="max_shard_size"):
        bridge = AutoBridge.from_hf_pretrained(good)
        bridge.save_hf_pretrained(bridge.to_megatron_model(wrap_with_ddp=False), tmp_path / "o", max_shard_size="lots")
    assert not (tmp_path / "o").exists()
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        AutoBridge.export_ckpt(tmp_path, tmp_path / "o2")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_weights_with_nan_or_inf_are_refused_unless_allowed(good, tmp_path, bad, monkeypatch) -> None:  # noqa: ANN001
    from megatron_bridge.bridge.hf_reader import ALLOW_NON_FINITE_ENV, HFWeightsReader

    folder = _copy(good, tmp_path / "corrupt")
    name = "model.layers.0.mlp.down_proj.weight"
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = folder / index["weight_map"][name]
    tensors = load_file(str(shard))
    tensors[name][0, :3] = bad
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(BridgeError, match=rf"tensor '{name}' of .* holds 3 NaN/Inf value\(s\) of .*: the checkpoint "
                       rf"is corrupt or diverged; use another one, or set {ALLOW_NON_FINITE_ENV}=1"):
        AutoBridge.from_hf_pretrained(folder).to_megatron_model(wrap_with_ddp=False)
    assert HFWeightsReader(folder, allow_non_finite=True).get(name).isnan().any() == (bad != bad)
    monkeypatch.setenv(ALLOW_NON_FINITE_ENV, "1")
    AutoBridge.from_hf_pretrained(folder).to_megatron_model(wrap_with_ddp=False)  # allowed: loads as it is
