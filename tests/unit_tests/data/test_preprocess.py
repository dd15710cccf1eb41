"""JSONL preprocessing (library function and CLI script) and the shipped corpus."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from megatron_bridge.config.data import TokenizerConfig
from megatron_bridge.data.corpus import default_corpus_path, ensure_corpus_indexed
from megatron_bridge.data.indexed import IndexedDataset
from megatron_bridge.data.preprocess import preprocess_jsonl
from megatron_bridge.data.tokenizers import build_tokenizer
from megatron_bridge.errors import DataError


REPO = Path(__file__).resolve().parents[3]
BYTE = TokenizerConfig(tokenizer_type="byte")
TEXTS = ["Hello world.", "Grüße aus Köln 🙂", "", "third document\nwith a newline"]


def _jsonl(path: Path, rows: list[dict[str, object]], blank_line: bool = True) -> Path:
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    if blank_line:
        lines.insert(1, "   ")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_preprocess_round_trip(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "in.jsonl", [{"text": t, "title": f"t{i}"} for i, t in enumerate(TEXTS)])
    summary = preprocess_jsonl(str(src), str(tmp_path / "out" / "x"), BYTE, json_keys=["text", "title"],
                               append_eod=True)
    assert summary.documents == 4
    assert summary.output_prefixes == {"text": str(tmp_path / "out" / "x_text_document"),
                                       "title": str(tmp_path / "out" / "x_title_document")}
    tok = build_tokenizer(BYTE)
    ds = IndexedDataset(summary.output_prefixes["text"])
    assert ds.dtype == np.uint16 and ds.num_documents == 4 and len(ds) == 3  # the empty text adds no sequence
    assert [tok.detokenize(ds[i].tolist()) for i in range(3)] == [t + "<eod>" for t in TEXTS if t]
    titles = IndexedDataset(summary.output_prefixes["title"])
    assert tok.detokenize(titles[3].tolist()) == "t3<eod>"
    assert summary.tokens == ds.num_tokens + titles.num_tokens


def test_workers_give_identical_files(tmp_path: Path) -> None:
    rows = [{"text": f"document number {i} " * (i % 7 + 1)} for i in range(200)]
    src = _jsonl(tmp_path / "in.jsonl", rows, blank_line=False)
    one = preprocess_jsonl(str(src), str(tmp_path / "one"), BYTE, append_eod=True)
    two = preprocess_jsonl(str(src), str(tmp_path / "two"), BYTE, append_eod=True, workers=2)
    for ext in (".bin", ".idx"):
        a = Path(one.output_prefixes["text"] + ext).read_bytes()
        assert a == Path(two.output_prefixes["text"] + ext).read_bytes()


@pytest.mark.parametrize(
    ("content", "message"),
    [("{bad json\n", r"in\.jsonl:1: not a JSON object"), ('{"body": "x"}\n', "no key 'text'"),
     ('{"text": 3}\n', "not a string"), ("[1, 2]\n", "expected a JSON object")],
)
def test_bad_input_lines(tmp_path: Path, content: str, message: str) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(content)
    with pytest.raises(DataError, match=message):
        preprocess_jsonl(str(src), str(tmp_path / "o"), BYTE)
    assert not (tmp_path / "o_text_document.bin").exists()
    with pytest.raises(DataError, match="does not exist"):
        preprocess_jsonl(str(tmp_path / "missing.jsonl"), str(tmp_path / "o"), BYTE)


def test_script(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "in.jsonl", [{"text": t} for t in TEXTS])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(REPO / "scripts" / "data" / "preprocess_data.py"), "--input", str(src),
           "--output-prefix", str(tmp_path / "out" / "corpus"), "--tokenizer-type", "byte", "--append-eod"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "docs=4 tokens=" in result.stdout and "seconds=" in result.stdout
    ds = IndexedDataset(str(tmp_path / "out" / "corpus_text_document"))
    assert ds.num_documents == 4
    bad = subprocess.run(cmd[:3] + [str(tmp_path / "nope.jsonl")] + cmd[4:], capture_output=True, text=True,
                         env=env, timeout=120)
    assert bad.returncode == 2 and "does not exist" in bad.stderr


def test_shipped_corpus() -> None:
    path = default_corpus_path()
    assert path.is_file() and path.stat().st_size >= 60_000
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(rows) >= 300
    assert all(set(r) == {"text"} and len(r["text"]) > 100 for r in rows)
    assert len({r["text"] for r in rows}) == len(rows)
    assert (path.parent / "README.md").is_file()


def test_ensure_corpus_indexed_caches(tmp_path: Path) -> None:
    prefix = ensure_corpus_indexed(str(tmp_path / "cache"))
    ds = IndexedDataset(prefix)
    assert ds.num_documents >= 300 and ds.num_tokens >= 60_000
    tok = build_tokenizer(BYTE)
    assert ds[0][-1] == tok.eod
    mtime = os.path.getmtime(prefix + ".idx")
    assert ensure_corpus_indexed(str(tmp_path / "cache")) == prefix
    assert os.path.getmtime(prefix + ".idx") == mtime
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(
        [Path(prefix).name + ".bin", Path(prefix).name + ".idx"]
    )
    Path(prefix + ".bin").write_bytes(b"\x00")  # a corrupt cache is rebuilt
    assert ensure_corpus_indexed(str(tmp_path / "cache")) == prefix
    assert IndexedDataset(prefix).num_tokens == ds.num_tokens
    small = _jsonl(tmp_path / "small.jsonl", [{"text": "abc"}], blank_line=False)
    other = ensure_corpus_indexed(str(tmp_path / "cache"), corpus_path=str(small))
    assert other != prefix and IndexedDataset(other).num_tokens == 4
