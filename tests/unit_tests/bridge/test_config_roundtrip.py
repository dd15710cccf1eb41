"""Exported config.json equals the source folder's, key for key, for Llama 3.1, Qwen3 and Qwen3-MoE folders (both
transformers config formats); only what the model or the export options change differs."""

import json
from pathlib import Path

import pytest

from megatron_bridge import AutoBridge
from megatron_bridge.bridge.config_out import exported_hf_config
from megatron_bridge.bridge.families import family_for_hf_config
from tests.unit_tests.bridge.hf_models import hf_model, to_rope_scaling_format, write_tokenizer


FAMILY_VARIANTS = ("llama3.1", "qwen3", "qwen3-moe", "mistral-window8", "mixtral", "deepseek-v3", "moonlight",
                   "deepseek-v2-lite", "deepseek-v2-groups")


def _source(folder: Path, variant: str, *, old_format: bool = False) -> Path:
    """A HF folder as a hub model ships it: tokenizer, and a generation config whose eos list differs from
    config.json's single eos (as Llama 3.1's [128001, 128008, 128009] vs 128001)."""
    hf_model(variant).save_pretrained(folder)
    write_tokenizer(folder)
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2, 7]}))
    if old_format:  # transformers 4.x: rope_scaling + rope_theta, torch_dtype
        to_rope_scaling_format(folder)
        config = json.loads((folder / "config.json").read_text())
        config["torch_dtype"] = config.pop("dtype")
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("old_format", [False, True])
@pytest.mark.parametrize("variant", FAMILY_VARIANTS)
def test_import_export_keeps_config_json(variant, old_format, tmp_path) -> None:  # noqa: ANN001
    src = _source(tmp_path / "src", variant, old_format=old_format)
    AutoBridge.import_ckpt(src, tmp_path / "ck")
    out = AutoBridge.export_ckpt(tmp_path / "ck", tmp_path / "out")
    assert _config(out) == _config(src)
    assert _config(out)["eos_token_id"] == 2
    assert (out / "generation_config.json").read_bytes() == (src / "generation_config.json").read_bytes()


@pytest.mark.parametrize("variant", FAMILY_VARIANTS)
def test_save_hf_pretrained_keeps_config_json_and_changes_only_what_is_asked(variant, tmp_path) -> None:  # noqa: ANN001
    src = _source(tmp_path / "src", variant)
    bridge = AutoBridge.from_hf_pretrained(src)
    chunks = bridge.to_megatron_model(wrap_with_ddp=False)
    assert _config(bridge.save_hf_pretrained(chunks, tmp_path / "same")) == _config(src)

    bf16 = _config(bridge.save_hf_pretrained(chunks, tmp_path / "bf16", weight_dtype="bfloat16"))
    assert bf16 == {**_config(src), "dtype": "bfloat16"}

    old = _config(bridge.save_hf_pretrained(chunks, tmp_path / "old", rope_format="rope_scaling"))
    rope = _config(src)["rope_parameters"]
    expected = {k: v for k, v in _config(src).items() if k != "rope_parameters"}
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    expected.update(rope_theta=rope["rope_theta"], rope_scaling=None if rope["rope_type"] == "default" else scaling)
    assert old == expected


def test_a_changed_model_changes_only_its_keys(tmp_path) -> None:  # noqa: ANN001
    src = _config(_source(tmp_path / "src", "qwen3-moe", old_format=True))
    family = family_for_hf_config(src)
    model = family.config_from_hf(src)
    model.num_moe_experts, model.ffn_hidden_size = 8, 96
    out = exported_hf_config(family, model, dtype="float32", rope_format=None, source=src, token_ids={})
    assert out == {**src, "num_local_experts": 8, "intermediate_size": 96}  # under the source's own key name

    model.vocab_size = 2  # the source's token ids fall outside the vocabulary: not written
    out = exported_hf_config(family, model, dtype="float32", rope_format=None, source=src, token_ids={})
    assert (out["vocab_size"], out["bos_token_id"], out["eos_token_id"], out["pad_token_id"]) == (2, 1, None, 0)


def test_without_a_source_config_token_ids_come_from_the_caller() -> None:
    src = hf_model("qwen3").config.to_dict()
    family = family_for_hf_config(src)
    out = exported_hf_config(family, family.config_from_hf(src), dtype="bfloat16", rope_format=None, source=None,
                             token_ids={"eos_token_id": 5, "pad_token_id": 1000})
    assert (out["eos_token_id"], out["pad_token_id"], out["bos_token_id"], out["dtype"]) == (5, None, None, "bfloat16")
    assert out["max_window_layers"] == out["num_hidden_layers"] and "rope_parameters" in out
