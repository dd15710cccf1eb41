"""Preprocessing checks its input where it enters and cleans up after itself (issue 27 items 6, 7): an empty input
is a named error with nothing written, text that cannot be encoded names its line, a SIGTERMed run removes its
temporaries, and the next run to a prefix removes those a SIGKILLed run left."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron_bridge.config.data import TokenizerConfig
from megatron_bridge.data.preprocess import preprocess_jsonl
from megatron_bridge.errors import DataError, PathError


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


# ------------------------------------------------------------------ issue 45, item 7: inputs and outputs it cannot use
def _jsonl_in(tmp_path: Path) -> Path:
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello"}\n')
    return src


@pytest.mark.parametrize(("make", "what"), [
    (lambda d: d, "it is a folder"),
    (lambda d: (os.mkfifo(d / "fifo"), d / "fifo")[1], r"it is a FIFO \(named pipe\)"),
    (lambda d: (_jsonl_in(d), d / "in.jsonl" / "x")[1], r"it is missing \(a parent of it is a file"),
])
def test_an_input_that_is_not_a_readable_file_says_what_it_is(make, what: str, tmp_path: Path) -> None:  # noqa: ANN001
    src = make(tmp_path)
    with pytest.raises(DataError, match=rf"input file '{src}' cannot be read: {what}"):
        preprocess_jsonl(str(src), str(tmp_path / "out" / "x"), BYTE)
    assert not (tmp_path / "out").exists()


def test_an_unreadable_input_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _jsonl_in(tmp_path)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p) == str(src) else real_access(p, mode))
    with pytest.raises(DataError, match="cannot be read: it is a regular file that is not readable"):
        preprocess_jsonl(str(src), str(tmp_path / "x"), BYTE)


def test_an_input_that_fails_to_open_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What root (for whom every file is readable) cannot set up with chmod: ``open`` refuses."""
    import builtins

    src = _jsonl_in(tmp_path)
    real_open = builtins.open

    def refusing(file, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if str(file) == str(src):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refusing)
    with pytest.raises(DataError, match=r"in.jsonl' cannot be read: Permission denied"):
        preprocess_jsonl(str(src), str(tmp_path / "out" / "x"), BYTE)
    assert not any(p.name.startswith(".") for p in tmp_path.rglob("*"))


@pytest.mark.parametrize(("prefix", "why"), [
    ("in.jsonl/x", "its folder '{d}/in.jsonl': it is a file, not a folder"),
    ("in.jsonl/sub/x", "'{d}/in.jsonl' is a file, not a folder, so nothing can be created under it"),
])
def test_an_output_prefix_under_a_file_is_refused(prefix: str, why: str, tmp_path: Path) -> None:
    src = _jsonl_in(tmp_path)
    with pytest.raises(PathError, match=re.escape(why.format(d=tmp_path))):
        preprocess_jsonl(str(src), str(tmp_path / prefix), BYTE)


def test_an_output_folder_that_is_not_writable_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _jsonl_in(tmp_path)
    (tmp_path / "ro").mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p).endswith("/ro") else real_access(p, mode))
    with pytest.raises(PathError, match=r"its folder '.*/ro': it is not writable; choose another --output-prefix"):
        preprocess_jsonl(str(src), str(tmp_path / "ro" / "x"), BYTE)


def test_a_write_that_fails_half_way_is_a_data_error_and_leaves_nothing(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron_bridge.data import preprocess

    def full(self, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        raise OSError(28, "No space left on device", str(args[0]))

    monkeypatch.setattr(preprocess.IndexedDatasetBuilder, "finalize", full)
    src = _jsonl_in(tmp_path)
    (tmp_path / "out").mkdir()
    with pytest.raises(DataError, match=r"failed: No space left on device \('.*'\); nothing written"):
        preprocess_jsonl(str(src), str(tmp_path / "out" / "x"), BYTE)
    assert _names(tmp_path / "out") == []


def test_the_script_says_it_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts/data/preprocess_data.py"), "--input", str(tmp_path),
                           "--output-prefix", str(tmp_path / "x")], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: input file '{tmp_path}' cannot be read: it is a folder; give a readable " \
                                  "JSONL file"
