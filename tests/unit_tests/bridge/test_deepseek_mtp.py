"""DeepSeek-V3's multi-token prediction layers through the Bridge: a folder that stores them (as DeepSeek's
checkpoints do: ``model.layers.{L}...``; transformers writes none) imports with ``mtp_num_layers`` set and every MTP
tensor in the model, exports byte-identical; a folder without them imports without MTP, as before."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from megatron_bridge import AutoBridge
from tests.unit_tests.bridge.hf_models import VOCAB, hf_model


TOKENS_VOCAB = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))


def _with_mtp(folder, variant: str = "deepseek-v3"):  # noqa: ANN001, ANN202
    """``variant``'s random model saved by transformers, then one MTP layer (index L) added the way DeepSeek-V3
    stores it: a decoder layer like the last one, enorm, hnorm, eh_proj, shared_head.norm, and copies of the
    embedding and the output layer."""
    model = hf_model(variant)
    model.save_pretrained(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    last, mtp = config["num_hidden_layers"] - 1, config["num_hidden_layers"]
    g = torch.Generator().manual_seed(7)
    h = config["hidden_size"]
    for name, tensor in list(tensors.items()):
        if name.startswith(f"model.layers.{last}."):
            tensors[name.replace(f".{last}.", f".{mtp}.", 1)] = torch.randn(tensor.shape, generator=g) * 0.1
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        tensors[f"model.layers.{mtp}.{norm}.weight"] = 1.0 + 0.1 * torch.randn(h, generator=g)
    tensors[f"model.layers.{mtp}.eh_proj.weight"] = torch.randn(h, 2 * h, generator=g) * 0.1
    tensors[f"model.layers.{mtp}.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors[f"model.layers.{mtp}.shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    assert config["num_nextn_predict_layers"] == 1
    return tensors


@pytest.mark.parametrize("variant", ["deepseek-v3", "moonlight"])
def test_mtp_layers_import_and_export_byte_identical(variant, tmp_path) -> None:  # noqa: ANN001
    src = tmp_path / "src"
    tensors = _with_mtp(src, variant)
    bridge = AutoBridge.from_hf_pretrained(src)
    assert bridge.to_megatron_provider(load_weights=False).mtp_num_layers == 1
    model = bridge.to_megatron_model(wrap_with_ddp=False)[0]
    layer = 3  # num_hidden_layers of the test variants
    state = model.state_dict()
    assert torch.equal(state[f"mtp.layers.{layer}.eh_proj.weight"], tensors[f"model.layers.{layer}.eh_proj.weight"])
    assert torch.equal(state[f"mtp.layers.{layer}.final_layernorm.weight"],
                       tensors[f"model.layers.{layer}.shared_head.norm.weight"])
    assert torch.equal(state[f"mtp.layers.{layer}.transformer_layer.mlp.router.expert_bias"],
                       tensors[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"])
    AutoBridge.import_ckpt(src, tmp_path / "ck")
    out = AutoBridge.export_ckpt(tmp_path / "ck", tmp_path / "out")
    back = load_file(out / "model.safetensors")
    assert sorted(back) == sorted(tensors)
    assert (out / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert json.loads((out / "config.json").read_text()) == json.loads((src / "config.json").read_text())


def test_a_folder_without_mtp_layers_imports_without_mtp(tmp_path) -> None:  # noqa: ANN001
    """transformers writes num_nextn_predict_layers=1 but no MTP tensors: no MTP is built, and an MTP folder's
    tensors are dropped when the model is built without MTP."""
    hf_model("deepseek-v3").save_pretrained(tmp_path / "plain")
    assert AutoBridge.from_hf_pretrained(tmp_path / "plain").to_megatron_provider(
        load_weights=False).mtp_num_layers is None
    _with_mtp(tmp_path / "mtp")
    bridge = AutoBridge.from_hf_config(json.loads((tmp_path / "mtp" / "config.json").read_text()))
    model = bridge.to_megatron_model(hf_path=tmp_path / "mtp", wrap_with_ddp=False)[0]
    assert model.mtp is None
    logits = model(TOKENS_VOCAB)
    assert logits.shape[0] == TOKENS_VOCAB.shape[0]


def test_a_differing_copy_is_warned_about(tmp_path, caplog) -> None:  # noqa: ANN001
    tensors = _with_mtp(tmp_path)
    tensors["model.layers.3.shared_head.head.weight"] = tensors["lm_head.weight"] + 1.0
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    AutoBridge.from_hf_pretrained(tmp_path).to_megatron_model(wrap_with_ddp=False)
    assert any("shared_head.head" in r.getMessage() and "differs" in r.getMessage() for r in caplog.records)
