"""A folder, a FIFO or an unreadable file given where a file is read is named as what it is, never as "missing"
(issue 45, item 7): the tokenizer file, a dataset prefix's .bin/.idx, a checkpoint's torch file, the input checks of
the scripts (:func:`megatron_bridge.utils.paths.check_input_file`)."""

import os
from pathlib import Path

import pytest

from megatron_bridge.errors import CheckpointError, DataError, PathError
from megatron_bridge.utils.paths import check_input_file, describe_path, file_problem


def _fifo(folder: Path) -> Path:
    os.mkfifo(folder / "pipe")
    return folder / "pipe"


def test_describe_path_names_every_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "f").write_text("x")
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    assert describe_path(tmp_path) == "a folder"
    assert describe_path(_fifo(tmp_path)) == "a FIFO (named pipe)"
    assert describe_path(tmp_path / "f") == "a regular file"
    assert describe_path(tmp_path / "nope") == "missing"
    assert describe_path(tmp_path / "dangling") == "a broken symbolic link"
    assert describe_path(tmp_path / "f" / "x") == "missing (a parent of it is a file, not a folder)"
    assert describe_path("/dev/null") == "a character device"
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if str(p).endswith("/f") else real_access(p, mode))
    assert describe_path(tmp_path / "f") == "a regular file that is not readable"
    assert file_problem(tmp_path / "f") == "is a regular file that is not readable"
    assert file_problem(tmp_path) == "is a folder, not a file"
    assert file_problem(tmp_path / "nope") == "does not exist"


@pytest.mark.parametrize(("make", "says"), [
    (lambda d: d, "is a folder, not a file"),
    (_fifo, r"is a FIFO \(named pipe\), not a regular file"),
    (lambda d: d / "tokenizer.json", "does not exist"),
])
def test_tokenizer_file(make, says: str, tmp_path: Path) -> None:  # noqa: ANN001
    from megatron_bridge.data.tokenizers import HuggingFaceTokenizer

    path = make(tmp_path)
    with pytest.raises(DataError, match=rf"tokenizer.tokenizer_file='{path}' {says}; give the path"):
        HuggingFaceTokenizer(str(path))


def test_dataset_prefix_whose_bin_is_a_folder(tmp_path: Path) -> None:
    from megatron_bridge.data.loaders import _open_indexed

    (tmp_path / "c_text_document.bin").mkdir()
    (tmp_path / "c_text_document.idx").write_bytes(b"")
    prefix = str(tmp_path / "c_text_document")
    with pytest.raises(DataError, match=rf"data_path entry '{prefix}': '{prefix}.bin' is a folder, not a file"):
        _open_indexed(prefix)


def test_checkpoint_torch_file_that_is_a_folder(tmp_path: Path) -> None:
    from megatron_bridge.checkpoint.reader import load_torch_file

    with pytest.raises(CheckpointError, match=rf"train state file '{tmp_path}' is a folder, not a file"):
        load_torch_file(tmp_path, "train state")


def test_check_input_file_says_what_it_is(tmp_path: Path) -> None:
    with pytest.raises(PathError, match=r"--compare='.*pipe' cannot be read: it is a FIFO \(named pipe\)"):
        check_input_file(_fifo(tmp_path), "--compare")
