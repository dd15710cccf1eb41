"""Tokenizers: byte, Hugging Face tokenizer.json (built here with the tokenizers library) and null."""

import json
from pathlib import Path

import pytest

from megatron_bridge.config.data import TokenizerConfig
from megatron_bridge.data.tokenizers import ByteTokenizer, build_tokenizer
from megatron_bridge.errors import ConfigValidationError, DataError


SENTENCES = [
    "the cat sat on the mat",
    "the dog ate the bone",
    "a bird sang in the tree",
    "rain fell on the quiet town",
]


def _train_hf(tmp_path: Path, specials: list[str], name: str = "tokenizer.json") -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["<unk>", *specials]))
    path = tmp_path / name
    tok.save(str(path))
    return path


def test_byte_round_trip_and_specials() -> None:
    tok = build_tokenizer(TokenizerConfig(tokenizer_type="byte", extra_special_tokens=["<sep>"]))
    assert isinstance(tok, ByteTokenizer)
    assert (tok.vocab_size, tok.eod, tok.pad) == (259, 256, 257)
    assert tok.special_token_id("<sep>") == 258
    text = "Grüße, 世界! 🙂 <eod> stays text"
    ids = tok.tokenize(text)
    assert ids == list(text.encode("utf-8"))
    assert all(0 <= i < 256 for i in ids)
    assert tok.detokenize(ids) == text
    assert tok.detokenize([104, 105, tok.eod, 258, 33]) == "hi<eod><sep>!"
    with pytest.raises(DataError, match="outside"):
        tok.detokenize([999])


def test_byte_duplicate_special_is_rejected() -> None:
    with pytest.raises(ConfigValidationError, match="extra_special_tokens"):
        build_tokenizer(TokenizerConfig(tokenizer_type="byte", extra_special_tokens=["<eod>"]))


def test_huggingface_round_trip(tmp_path: Path) -> None:
    path = _train_hf(tmp_path, ["<|endoftext|>", "<pad>"])
    tok = build_tokenizer(TokenizerConfig(tokenizer_type="huggingface", tokenizer_file=str(path)))
    assert tok.eod == 1 and tok.pad == 2
    ids = tok.tokenize("the cat ate the bone")
    assert len(ids) == 5 and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.detokenize(ids) == "the cat ate the bone"
    assert tok.vocab_size == len(json.loads(path.read_text())["model"]["vocab"])


def test_huggingface_eos_from_tokenizer_config(tmp_path: Path) -> None:
    path = _train_hf(tmp_path, ["<|end|>"])
    with pytest.raises(DataError, match="tokenizer.eod_token"):
        build_tokenizer(TokenizerConfig(tokenizer_type="huggingface", tokenizer_file=str(path)))
    tok = build_tokenizer(TokenizerConfig(tokenizer_type="huggingface", tokenizer_file=str(path), eod_token="<|end|>"))
    assert tok.eod == 1 and tok.pad == tok.eod
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|end|>"}}))
    tok = build_tokenizer(TokenizerConfig(tokenizer_type="huggingface", tokenizer_file=str(path)))
    assert tok.eod == 1
    with pytest.raises(DataError, match="not in the vocabulary"):
        build_tokenizer(TokenizerConfig(tokenizer_type="huggingface", tokenizer_file=str(path), eod_token="</s>"))


def test_huggingface_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(ConfigValidationError, match="tokenizer.tokenizer_file"):
        build_tokenizer(TokenizerConfig(tokenizer_type="huggingface"))
    with pytest.raises(DataError, match="does not exist"):
        build_tokenizer(TokenizerConfig(tokenizer_type="huggingface", tokenizer_file=str(tmp_path / "nope.json")))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="cannot read"):
        build_tokenizer(TokenizerConfig(tokenizer_type="huggingface", tokenizer_file=str(bad)))


def test_null_tokenizer() -> None:
    tok = build_tokenizer(TokenizerConfig(tokenizer_type="null", vocab_size=1000))
    assert (tok.vocab_size, tok.eod) == (1000, 999)
    with pytest.raises(DataError, match="cannot tokenize"):
        tok.tokenize("hello")
    assert tok.detokenize([1, 2]) == "1 2"
    with pytest.raises(ConfigValidationError, match="tokenizer.vocab_size"):
        build_tokenizer(TokenizerConfig(tokenizer_type="null"))


def test_unknown_type() -> None:
    with pytest.raises(ConfigValidationError, match="tokenizer_type"):
        build_tokenizer(TokenizerConfig(tokenizer_type="sentencepiece"))  # type: ignore[arg-type]
