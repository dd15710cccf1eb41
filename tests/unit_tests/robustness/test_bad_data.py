"""Bad data is a named error: token ids outside [0, vocab) in a file of any size (here > 2^24 tokens), negative ids,
non-UTF-8 JSONL (file and line), and preprocessing that never destroys an existing dataset."""

import json
from pathlib import Path

import numpy as np
import pytest

from megatron_bridge.config.data import DatasetConfig, TokenizerConfig
from megatron_bridge.data.indexed import IndexedDataset, encode_index
from megatron_bridge.data.loaders import build_pretraining_datasets
from megatron_bridge.data.preprocess import preprocess_jsonl
from megatron_bridge.data.tokenizers import build_tokenizer
from megatron_bridge.errors import DataError


BYTE = TokenizerConfig(tokenizer_type="byte")
TOK = build_tokenizer(BYTE)


def _write_indexed(prefix: Path, tokens: np.ndarray, docs: int = 64) -> None:
    lengths = np.full(docs, len(tokens) // docs, dtype=np.int32)
    lengths[-1] += len(tokens) - int(lengths.sum())
    tokens.tofile(f"{prefix}.bin")
    Path(f"{prefix}.idx").write_bytes(encode_index(tokens.dtype, lengths, np.arange(docs + 1)))


def _open(prefix: Path) -> None:
    cfg = DatasetConfig(mock=False, data_path=[str(prefix)], seq_length=16, split="100,0,0")
    build_pretraining_datasets(cfg, TOK, (8, 0, 0))


def test_out_of_range_id_in_a_large_file(tmp_path):
    n = (1 << 24) + 1000  # above the size the check used to skip
    tokens = np.full(n, 7, dtype=np.uint16)
    tokens[n - 3] = TOK.vocab_size + 5
    _write_indexed(tmp_path / "big", tokens)
    with pytest.raises(DataError, match=rf"token id {TOK.vocab_size + 5} >= the tokenizer's vocab_size"):
        _open(tmp_path / "big")


def test_negative_id_is_named(tmp_path):
    tokens = np.full(4096, 7, dtype=np.int32)
    tokens[100] = -3
    _write_indexed(tmp_path / "neg", tokens)
    with pytest.raises(DataError, match="negative token id -3"):
        _open(tmp_path / "neg")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_token_dataset_is_named(tmp_path, dtype):
    _write_indexed(tmp_path / "floats", np.full(4096, 7.0, dtype=dtype))
    with pytest.raises(DataError, match=rf"floats' stores {np.dtype(dtype)} values, not token ids \(an integer type\)"):
        _open(tmp_path / "floats")


def test_non_utf8_jsonl_names_file_and_line(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9 latin-1"}\n')
    with pytest.raises(DataError, match=rf"{src}:2: not valid UTF-8"):
        preprocess_jsonl(str(src), str(tmp_path / "out"), BYTE)


def _jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def test_preprocessing_over_an_existing_prefix_keeps_the_old_dataset(tmp_path):
    good = _jsonl(tmp_path / "good.jsonl", ["hello world"] * 5)
    prefix = tmp_path / "out" / "x"
    first = preprocess_jsonl(str(good), str(prefix), BYTE)
    dataset = first.output_prefixes["text"]
    before = (Path(f"{dataset}.bin").read_bytes(), Path(f"{dataset}.idx").read_bytes())

    with pytest.raises(DataError, match="already exists: pass --overwrite"):  # no flag: refused before any work
        preprocess_jsonl(str(good), str(prefix), BYTE)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "new"}\n' * 50 + "not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl:51: not a JSON object"):  # fails half-way, with the flag
        preprocess_jsonl(str(bad), str(prefix), BYTE, overwrite=True)
    assert (Path(f"{dataset}.bin").read_bytes(), Path(f"{dataset}.idx").read_bytes()) == before
    assert len(IndexedDataset(dataset)) == 5
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["x_text_document.bin", "x_text_document.idx"]

    second = preprocess_jsonl(str(_jsonl(tmp_path / "new.jsonl", ["a", "b"])), str(prefix), BYTE, overwrite=True)
    assert second.documents == 2 and len(IndexedDataset(dataset)) == 2
