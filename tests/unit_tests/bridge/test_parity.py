"""Exactness of the Bridge for every family and variant: HF → ours and ours → HF give the same logits (fp32,
≤ 1e-5) and the same greedy generations, through every folder layout and both config formats."""

import json
import logging
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from megatron_bridge import AutoBridge
from megatron_bridge.config.checkpoint import CheckpointConfig
from megatron_bridge.config.container import ConfigContainer
from tests.unit_tests.bridge.hf_models import (
    VARIANTS,
    VOCAB,
    hf_logits,
    hf_model,
    our_greedy,
    our_logits,
    to_bin,
    to_rope_scaling_format,
)
from tests.unit_tests.checkpoint.toy import build_run, train


TOL = 1e-5
TOKENS = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0))


def _import_logits(folder) -> torch.Tensor:  # noqa: ANN001
    return our_logits(AutoBridge.from_hf_pretrained(folder).to_megatron_model(wrap_with_ddp=False)[0], TOKENS)


@pytest.mark.support_cells("llama:hf", "qwen3:hf", "qwen3_moe:hf", "mistral:hf", "mixtral:hf",
                            "deepseek_v3:hf", "deepseek_v2:hf", "gemma3:hf", "gpt_oss:hf", "gemma2:hf")
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_import_matches_hf_logits(variant, tmp_path) -> None:  # noqa: ANN001
    model = hf_model(variant)
    model.save_pretrained(tmp_path)
    expected = hf_logits(model, TOKENS)
    assert (_import_logits(tmp_path) - expected).abs().max() <= TOL


def _load_hf_quietly(folder, caplog):  # noqa: ANN001, ANN202
    """transformers' from_pretrained with every warning and log record captured; asserts there were none and no
    missing/unexpected/mismatched keys."""
    from transformers import AutoModelForCausalLM

    caplog.clear()
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    records = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not records, records
    assert not [str(w.message) for w in caught if "transformers" in str(w.filename)], [str(w.message) for w in caught]
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


@pytest.mark.parametrize("rope_format", ["rope_parameters", "rope_scaling"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_trained_checkpoint_exports_to_hf(variant, rope_format, tmp_path, caplog) -> None:  # noqa: ANN001
    """Our checkpoint (a model of the HF config, trained 2 steps) → HF folder: same logits, same greedy tokens."""
    src = tmp_path / "hf_src"
    hf_model(variant).save_pretrained(src)
    bridge = AutoBridge.from_hf_pretrained(src)
    cfg = ConfigContainer(model=bridge.to_megatron_provider(), checkpoint=CheckpointConfig(save=str(tmp_path / "ck")))
    cfg.model.seq_length = cfg.dataset.seq_length = 16
    cfg.optimizer.lr = 1e-2
    run = build_run(cfg, seed=1)
    train(run, 2)
    run.manager.save()
    ours = run.backend.chunks[0]

    out = AutoBridge.export_ckpt(tmp_path / "ck", tmp_path / "hf_out", rope_format=rope_format,
                                 source_path=src)
    config = json.loads((out / "config.json").read_text())
    assert ("rope_parameters" in config) == (rope_format == "rope_parameters")
    assert config["bos_token_id"] == 1 and config["eos_token_id"] == 2 and config["pad_token_id"] == 0
    assert config["max_position_embeddings"] == bridge.hf_config["max_position_embeddings"]
    hf = _load_hf_quietly(out, caplog)
    assert (hf_logits(hf, TOKENS) - our_logits(ours, TOKENS)).abs().max() <= TOL
    prompt = TOKENS[:1, :5]
    # An explicit mask: the prompt holds token 0, the pad id, which generate would otherwise mask out.
    generated = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8,
                            do_sample=False)[0].tolist()
    assert generated == our_greedy(ours, prompt, 8, eos=2)


def test_live_model_round_trip_sharded(tmp_path, caplog) -> None:  # noqa: ANN001
    """to_megatron_model → save_hf_pretrained with small shards → index + several files; transformers and the
    Bridge both read it back exactly."""
    model = hf_model("qwen3")
    model.save_pretrained(tmp_path / "src")
    bridge = AutoBridge.from_hf_pretrained(tmp_path / "src")
    ours = bridge.to_megatron_model(wrap_with_ddp=False)
    out = bridge.save_hf_pretrained(ours, tmp_path / "out", max_shard_size="20KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert (hf_logits(_load_hf_quietly(out, caplog), TOKENS) - hf_logits(model, TOKENS)).abs().max() <= TOL
    assert (_import_logits(out) - hf_logits(model, TOKENS)).abs().max() <= TOL
    names = dict(bridge.export_hf_weights(ours))
    assert torch.equal(names["model.embed_tokens.weight"], model.model.embed_tokens.weight)


@pytest.mark.parametrize("layout", ["sharded-safetensors", "bin", "sharded-bin", "rope_scaling-config"])
def test_every_folder_layout_imports_exactly(layout, tmp_path) -> None:  # noqa: ANN001
    model = hf_model("llama3.1")
    model.save_pretrained(tmp_path, max_shard_size="20KB" if layout == "sharded-safetensors" else "50GB")
    if layout == "sharded-safetensors":
        assert (tmp_path / "model.safetensors.index.json").is_file()
    if layout == "bin":
        to_bin(tmp_path)
    if layout == "sharded-bin":
        to_bin(tmp_path, shards=3)
    if layout == "rope_scaling-config":
        to_rope_scaling_format(tmp_path)
        assert "rope_scaling" in json.loads((tmp_path / "config.json").read_text())
    assert (_import_logits(tmp_path) - hf_logits(model, TOKENS)).abs().max() <= TOL


def test_stray_lm_head_of_a_tied_model_is_ignored(tmp_path) -> None:  # noqa: ANN001
    model = hf_model("llama3.2-tied")
    model.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert "lm_head.weight" not in tensors
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    assert (_import_logits(tmp_path) - hf_logits(model, TOKENS)).abs().max() <= TOL


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_import_then_export_is_byte_identical(variant, tmp_path) -> None:  # noqa: ANN001
    """HF folder (written by transformers) → our checkpoint → HF folder: the same weights file, byte for byte (the
    vocabulary padded on import and cut back on export), and the same config.json."""
    hf_model(variant).save_pretrained(tmp_path / "src")
    AutoBridge.import_ckpt(tmp_path / "src", tmp_path / "ck")
    out = AutoBridge.export_ckpt(tmp_path / "ck", tmp_path / "out")
    src, back = load_file(tmp_path / "src" / "model.safetensors"), load_file(out / "model.safetensors")
    assert sorted(back) == sorted(src)
    for name, tensor in src.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
    assert (out / "model.safetensors").read_bytes() == (tmp_path / "src" / "model.safetensors").read_bytes()
    assert json.loads((out / "config.json").read_text()) == json.loads((tmp_path / "src" / "config.json").read_text())
