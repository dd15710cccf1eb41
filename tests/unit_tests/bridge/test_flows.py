"""The one-call flows and training from HF weights: import_ckpt → pretrain's loader, pretrained_checkpoint = HF
folder (checked against cfg.model), tokenizer files and token ids carried from import to export, the CLI."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron_bridge import AutoBridge
from megatron_bridge.config.checkpoint import CheckpointConfig
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.errors import BridgeError
from megatron_bridge.utils.cli import EXIT_USER_ERROR, run_cli
from tests.unit_tests.bridge.hf_models import VOCAB, hf_logits, hf_model, our_logits, write_tokenizer
from tests.unit_tests.checkpoint.toy import build_run


REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "checkpoint" / "convert.py"
TOKENS = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:  # noqa: ANN001
    """A Llama 3.2-style (tied, scaled RoPE) HF folder with a tokenizer."""
    folder = tmp_path_factory.mktemp("hf")
    hf_model("llama3.2-tied").save_pretrained(folder)
    write_tokenizer(folder)
    return folder


def _run_from(cfg: ConfigContainer, **ckpt: object):  # noqa: ANN202
    cfg.checkpoint = CheckpointConfig(**ckpt)  # type: ignore[arg-type]
    run = build_run(cfg, seed=7)
    assert run.manager.load()
    return run


def test_import_ckpt_trains_from_and_resumes(hf_folder, tmp_path) -> None:  # noqa: ANN001
    root = AutoBridge.import_ckpt(hf_folder, tmp_path / "imported")
    folder = root / "iter_0000000"
    assert (folder / "hf_assets" / "tokenizer.json").is_file() and (folder / "hf_assets" / "config.json").is_file()
    cfg = ConfigContainer.from_yaml(folder / "run_config.yaml")
    assert cfg.tokenizer.tokenizer_type == "huggingface" and Path(cfg.tokenizer.tokenizer_file).is_file()
    expected = hf_logits(hf_model("llama3.2-tied"), TOKENS)
    for ckpt in ({"pretrained_checkpoint": str(root)}, {"load": str(root)}):
        run = _run_from(ConfigContainer.from_yaml(folder / "run_config.yaml"), **ckpt)
        assert run.state.step == 0
        assert (our_logits(run.backend.chunks[0], TOKENS) - expected).abs().max() <= 1e-5


def test_pretrained_checkpoint_hf_folder_is_checked_against_the_model(hf_folder) -> None:  # noqa: ANN001
    model = AutoBridge.from_hf_pretrained(hf_folder).to_megatron_provider()
    run = _run_from(ConfigContainer(model=model), pretrained_checkpoint=str(hf_folder))
    expected = hf_logits(hf_model("llama3.2-tied"), TOKENS)
    assert (our_logits(run.backend.chunks[0], TOKENS) - expected).abs().max() <= 1e-5

    for field, value in (("ffn_hidden_size", 96), ("rotary_base", 10000.0), ("rope_scaling_factor", 8.0),
                         ("share_embeddings_and_output_weights", False)):
        wrong = AutoBridge.from_hf_pretrained(hf_folder).to_megatron_provider()
        setattr(wrong, field, value)
        cfg = ConfigContainer(model=wrong, checkpoint=CheckpointConfig(pretrained_checkpoint=str(hf_folder)))
        with pytest.raises(BridgeError, match=rf"model\.{field}={value!r} but the folder's config.json says"):
            build_run(cfg).manager.load()


def test_tokenizer_and_token_ids_survive_import_train_export(hf_folder, tmp_path) -> None:  # noqa: ANN001
    """HF → import_ckpt → a run started from it saves → export: tokenizer files, generation config and token ids
    come along through the run's pretrained_checkpoint."""
    root = AutoBridge.import_ckpt(hf_folder, tmp_path / "imported")
    cfg = ConfigContainer.from_yaml(root / "iter_0000000" / "run_config.yaml")
    run = _run_from(cfg, pretrained_checkpoint=str(root), save=str(tmp_path / "run"))
    run.state.step = 3
    run.manager.save()
    out = AutoBridge.export_ckpt(tmp_path / "run", tmp_path / "out")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (hf_folder / name).read_bytes(), name
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 0)
    assert config["max_position_embeddings"] == 512 and config["tie_word_embeddings"] is True


def test_export_without_a_source_takes_token_ids_from_the_tokenizer(tmp_path) -> None:  # noqa: ANN001
    """A run trained from scratch with the byte tokenizer: eos = <eod> (256), pad = <pad> (257)."""
    from megatron_bridge.recipes.tiny import tiny_llama_pretrain_config

    cfg = tiny_llama_pretrain_config()
    cfg.model.num_layers, cfg.model.hidden_size, cfg.model.ffn_hidden_size = 1, 32, 64
    cfg.checkpoint = CheckpointConfig(save=str(tmp_path / "run"))
    build_run(cfg).manager.save()
    out = AutoBridge.export_ckpt(tmp_path / "run", tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert (config["eos_token_id"], config["pad_token_id"], config["bos_token_id"]) == (256, 257, None)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 256


def test_cli_import_export_and_errors(hf_folder, tmp_path) -> None:  # noqa: ANN001
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import convert as cli  # the script's main(), in-process
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert cli.main([str(hf_folder), str(tmp_path / "ck"), "--to", "megatron"]) == 0
    assert cli.main([str(tmp_path / "ck"), str(tmp_path / "hf"), "--to", "hf", "--dtype", "bfloat16",
                     "--max-shard-size", "20KB", "--rope-format", "rope_scaling"]) == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["rope_scaling"]["rope_type"] == "llama3"
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    # the output exists: refused without --overwrite, nothing touched
    assert run_cli(cli.main, [str(tmp_path / "ck"), str(tmp_path / "hf"), "--to", "hf"]) == EXIT_USER_ERROR
    assert cli.main([str(tmp_path / "ck"), str(tmp_path / "hf"), "--to", "hf", "--overwrite"]) == 0
    assert run_cli(cli.main, [str(tmp_path / "nothing"), str(tmp_path / "x"), "--to", "megatron"]) == EXIT_USER_ERROR
    assert not (tmp_path / "x").exists()
    code = ("import runpy, sys\n"  # cold, as a user runs it: --help answers without importing torch (0.1 s, not 3)
            f"sys.argv = [{str(SCRIPT)!r}, '--help']\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "finally:\n    sys.stderr.write(f'torch imported: {\"torch\" in sys.modules}')\n")
    help_text = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert help_text.returncode == 0, help_text.stderr
    assert "--to {torch,hf,megatron,megatron_core}" in help_text.stdout and "--max-shard-size" in help_text.stdout
    assert help_text.stderr.endswith("torch imported: False"), help_text.stderr


def test_data_tokenizer_adds_bos_as_the_hf_tokenizer_does(hf_folder, tmp_path) -> None:  # noqa: ANN001
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from megatron_bridge.config.data import TokenizerConfig
    from megatron_bridge.data.tokenizers import build_tokenizer

    text = "w5 w6 w7"
    file = str(hf_folder / "tokenizer.json")
    expected = AutoTokenizer.from_pretrained(hf_folder)(text).input_ids
    assert expected == [1, 5, 6, 7]
    tok = build_tokenizer(TokenizerConfig(tokenizer_type="huggingface", tokenizer_file=file))
    assert tok.bos == 1 and tok.tokenize(text) == expected
    no_bos = build_tokenizer(TokenizerConfig(tokenizer_type="huggingface", tokenizer_file=file, add_bos=False))
    assert no_bos.tokenize(text) == [5, 6, 7]

    plain = Tokenizer.from_file(file)  # a Qwen3-style file: no post-processor, no bos_token
    plain.post_processor = None
    plain.save(str(tmp_path / "tokenizer.json"))
    plain_file = str(tmp_path / "tokenizer.json")
    qwen = build_tokenizer(TokenizerConfig(tokenizer_type="huggingface", tokenizer_file=plain_file))
    assert qwen.bos is None and qwen.tokenize(text) == [5, 6, 7]
    with pytest.raises(ValueError, match="tokenizer.add_bos=True"):
        build_tokenizer(TokenizerConfig(tokenizer_type="huggingface", tokenizer_file=plain_file, add_bos=True))
    with pytest.raises(ValueError, match="tokenizer.add_bos=True needs a huggingface tokenizer"):
        build_tokenizer(TokenizerConfig(tokenizer_type="byte", add_bos=True))


def test_dtype_choice_on_import(hf_folder) -> None:  # noqa: ANN001
    bf16 = AutoBridge.from_hf_pretrained(hf_folder, torch_dtype=torch.bfloat16)
    assert bf16.to_megatron_provider().params_dtype == "bfloat16"
    chunk = bf16.to_megatron_model(wrap_with_ddp=False)[0]
    assert chunk.embed_tokens.weight.dtype == torch.bfloat16
    auto = AutoBridge.from_hf_pretrained(hf_folder, torch_dtype="auto")  # the folder says float32
    assert auto.to_megatron_provider().params_dtype == "float32"
    with pytest.raises(BridgeError, match="dtype 'int8' is not supported"):
        AutoBridge.from_hf_pretrained(hf_folder, dtype="int8")
