"""Preprocessing checks its input where it enters and cleans up after itself (issue 27 items 6, 7): an empty input
is a named error with nothing written, text that cannot be encoded names its line, a SIGTERMed run removes its
temporaries, and the next run to a prefix removes those a SIGKILLed run left."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron_bridge.config.data import TokenizerConfig
from megatron_bridge.data.preprocess import preprocess_jsonl
from megatron_bridge.errors import DataError


REPO = Path(__file__).resolve().parents[3]
BYTE = TokenizerConfig(tokenizer_type="byte")


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("content", ["", "\n  \n\n"])
def test_empty_input_is_refused_and_nothing_is_written(tmp_path: Path, content: str) -> None:
    src = tmp_path / "empty.jsonl"
    src.write_text(content)
    (tmp_path / "out").mkdir()
    with pytest.raises(DataError, match=r"empty.jsonl' holds no documents .*: nothing written"):
        preprocess_jsonl(str(src), str(tmp_path / "out" / "x"), BYTE)
    assert _names(tmp_path / "out") == []


def test_text_that_cannot_be_encoded_names_its_line(tmp_path: Path) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text('{"text": "fine"}\n{"text": "a\\ud800b"}\n')  # valid JSON, a lone surrogate once decoded
    (tmp_path / "out").mkdir()
    with pytest.raises(DataError, match=r"bad.jsonl:2: 'text' holds text that cannot be encoded as UTF-8 "
                       r"\(surrogates not allowed: '\\ud800' at character 1"):
        preprocess_jsonl(str(src), str(tmp_path / "out" / "x"), BYTE)
    assert _names(tmp_path / "out") == []


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_next_run_removes_temporaries_of_a_killed_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    dead = out / f".x_text_document.bin.tmp-{_dead_pid()}-0123456789ab"
    live = out / f".x_text_document.idx.tmp-{os.getpid()}-0123456789ab"  # a writer that still runs: kept
    dead.write_bytes(b"partial")
    live.write_bytes(b"in progress")
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello"}\n')
    preprocess_jsonl(str(src), str(out / "x"), BYTE)
    assert _names(out) == sorted([live.name, "x_text_document.bin", "x_text_document.idx"])


def test_an_interrupt_right_after_the_first_temporary_is_created_removes_it(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The window test_sigterm_removes_the_temporaries can hit on a loaded machine (it signals as soon as the file
    appears): the SIGTERM handler's KeyboardInterrupt lands after the builder opened its ``.bin``."""
    from megatron_bridge.data import preprocess

    opened = preprocess.IndexedDatasetBuilder.__init__

    def interrupted(self, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        opened(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(preprocess.IndexedDatasetBuilder, "__init__", interrupted)
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "a document"}) + "\n")
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        preprocess_jsonl(str(src), str(out / "x"), BYTE)
    assert _names(out) == []


def test_sigterm_removes_the_temporaries(tmp_path: Path) -> None:
    src = tmp_path / "big.jsonl"
    with src.open("w") as f:
        for i in range(400_000):
            f.write(json.dumps({"text": f"document {i} " * 8}) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts/data/preprocess_data.py"), "--input", str(src),
                             "--output-prefix", str(out / "x")], stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.monotonic() + 60
    while not any(p.name.startswith(".x_text_document.bin.tmp-") for p in out.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, "the run never started writing"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err  # ended as an interruption, not killed mid-write
    assert _names(out) == [], _names(out)
