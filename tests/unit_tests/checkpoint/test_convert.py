"""Export to a torch file and a Hugging Face Llama folder, import back, and the CLI."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from megatron_bridge.bridge.convert import (
    convert_weights,
    read_hf_folder,
    read_model_weights,
    write_hf_folder,
)
from megatron_bridge.errors import CheckpointError
from megatron_bridge.utils.cli import EXIT_USER_ERROR, run_cli
from tests.functional_tests.launcher import warm_python
from tests.unit_tests.checkpoint.toy import VOCAB, build_run, full_weights, tiny_cfg, train


REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "checkpoint" / "convert.py"


@pytest.fixture(scope="module", params=["torch_dist", "torch"])
def trained(request, tmp_path_factory):
    """A checkpoint root (format from the param) of a run trained 2 steps, and that run's full weights."""
    root = tmp_path_factory.mktemp("src")
    run = build_run(tiny_cfg(save=str(root), ckpt_format=request.param))
    train(run, 2)
    run.manager.save()
    return root, full_weights(run), run


@torch.no_grad()
def logits(run, vocab=VOCAB):
    tokens = torch.arange(0, 32).view(2, 16) % vocab
    return run.backend.chunks[0](tokens)[..., :vocab]


def test_read_model_weights_from_a_checkpoint(trained):
    root, weights, _ = trained
    got = read_model_weights(root)
    assert got.keys() == weights.keys()
    assert all(torch.equal(got[k], weights[k]) for k in weights)


def test_torch_file_round_trip_and_pretrained_load(trained, tmp_path):
    root, weights, src = trained
    out = convert_weights(root, tmp_path / "weights.pt", "torch")
    content = torch.load(out, weights_only=True)
    assert all(torch.equal(content["model"][k], weights[k]) for k in weights)
    dst = build_run(tiny_cfg(pretrained_checkpoint=str(out)), seed=3)
    assert dst.manager.load() and dst.state.step == 0
    assert torch.equal(logits(dst), logits(src))


def test_hf_export_names_unpadding_and_config(trained, tmp_path):
    root, weights, src = trained
    out = convert_weights(root, tmp_path / "hf", "hf")
    tensors = load_file(str(out / "model.safetensors"))
    assert "model.embed_tokens.weight" in tensors and "lm_head.weight" in tensors
    assert "model.layers.1.self_attn.q_proj.weight" in tensors and "model.norm.weight" in tensors
    assert tensors["model.embed_tokens.weight"].shape == (VOCAB, 32)  # 112 padded rows cut to vocab_size
    assert torch.equal(tensors["lm_head.weight"], weights["lm_head.weight"][:VOCAB])
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == VOCAB
    assert config["num_key_value_heads"] == 2 and config["intermediate_size"] == 64
    assert config["tie_word_embeddings"] is False

    # Back in: the HF folder as pretrained_checkpoint gives the same logits over the real vocabulary.
    dst = build_run(tiny_cfg(pretrained_checkpoint=str(out)), seed=3)
    assert dst.manager.load()
    assert torch.equal(logits(dst), logits(src))
    padded = read_hf_folder(out, padded_vocab_size=112)["embed_tokens.weight"]
    assert padded.shape == (112, 32) and not padded[VOCAB:].any()


def test_tied_embeddings_export_has_no_lm_head(tmp_path):
    cfg = tiny_cfg()
    cfg.model.share_embeddings_and_output_weights = True
    run = build_run(cfg)
    out = write_hf_folder(full_weights(run), cfg.model, tmp_path / "hf")
    assert "lm_head.weight" not in load_file(str(out / "model.safetensors"))
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True


def test_non_llama_architectures_are_refused(tmp_path):
    cfg = tiny_cfg()
    cfg.model.activation = "gelu"
    with pytest.raises(CheckpointError, match=r"activation='gelu'.*is not a llama model"):
        write_hf_folder({"norm.weight": torch.ones(32)}, cfg.model, tmp_path)


def test_hf_export_of_a_weights_file_needs_the_config(trained, tmp_path):
    root, _, _ = trained
    weights_file = convert_weights(root, tmp_path / "w.pt", "torch")
    with pytest.raises(CheckpointError, match="needs the model config"):
        convert_weights(weights_file, tmp_path / "hf", "hf")


def test_cli(tmp_path):
    """The script end to end: checkpoint → HF folder → torch file; errors exit 2 with a message."""
    root = tmp_path / "ckpt"
    run = build_run(tiny_cfg(save=str(root)))
    run.manager.save()
    weights = full_weights(run)
    python, env = warm_python()  # forked warm from the suite's fork server where it has one
    hf = subprocess.run([python, str(SCRIPT), str(root), str(tmp_path / "hf"), "--to", "hf"],
                        capture_output=True, text=True, env=env, cwd=REPO)
    assert hf.returncode == 0, hf.stderr
    from_hf = tmp_path / "from_hf.pt"
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import convert as cli  # the script's main(), in-process
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert cli.main([str(tmp_path / "hf"), str(from_hf), "--to", "torch"]) == 0
    back = torch.load(from_hf, weights_only=True)["model"]
    assert torch.equal(back["embed_tokens.weight"], weights["embed_tokens.weight"][:VOCAB])
    assert run_cli(cli.main, [str(tmp_path / "nothing"), str(from_hf), "--to", "torch"]) == EXIT_USER_ERROR


@pytest.mark.parametrize(("variant", "architecture"), [("mistral-window8", "MistralForCausalLM"),
                                                       ("mixtral", "MixtralForCausalLM"),
                                                       ("qwen3", "Qwen3ForCausalLM")])
def test_cli_exports_each_family_as_its_own_architecture(variant: str, architecture: str, tmp_path: Path) -> None:
    """convert.py with no --family: the checkpoint's declared model.family picks the HF architecture (never the
    first family whose shape fits), and the weights come back as transformers wrote them."""
    from megatron_bridge.bridge import AutoBridge
    from tests.unit_tests.bridge.hf_models import hf_model

    hf_model(variant).save_pretrained(tmp_path / "src")
    root = AutoBridge.import_ckpt(tmp_path / "src", tmp_path / "ckpt")
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import convert as cli  # the script's main(), in-process
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert cli.main([str(root), str(tmp_path / "hf"), "--to", "hf"]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [architecture]
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == (tmp_path / "src" / "model.safetensors").read_bytes()
