"""Config files and keys a user cannot see the fault in (issue 45, item 7): a YAML nested thousands deep, a file
with a Latin-1 byte, a folder or FIFO given as the file, and a key with a look-alike letter are named errors."""

import os
from pathlib import Path

import pytest

from megatron_bridge.config.serialization import MAX_YAML_DEPTH, load_yaml_text
from megatron_bridge.errors import ConfigOverrideError
from megatron_bridge.recipes import tiny_llama_pretrain_config


def _apply(yaml_path: Path | None = None, overrides: list[str] | None = None) -> None:
    tiny_llama_pretrain_config().apply_overrides(None if yaml_path is None else str(yaml_path), overrides or [])


@pytest.mark.parametrize("text", [
    "train:\n  x: " + "[" * 5000 + "]" * 5000 + "\n",  # flow lists
    "".join("  " * i + f"k{i}:\n" for i in range(5000)),  # block mappings
])
def test_yaml_nested_thousands_deep_is_refused(text: str, tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    with pytest.raises(ConfigOverrideError, match=rf"deep.yaml' nests mappings/lists more than {MAX_YAML_DEPTH} "
                       r"deep \(line \d+, column \d+\)"):
        _apply(path)


def test_yaml_nesting_a_config_uses_is_read() -> None:
    assert load_yaml_text("a:\n  b:\n    c: [[1, 2], {d: 3}]\n") == {"a": {"b": {"c": [[1, 2], {"d": 3}]}}}


def test_yaml_with_a_latin1_byte_names_the_byte_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin.yaml"
    path.write_bytes(b"train:\n  train_iters: 5  # caf\xe9\n")
    with pytest.raises(ConfigOverrideError, match=r"latin.yaml' is not UTF-8 text: byte 0xe9 at line 2, column 24 "
                       r".*save the file as UTF-8"):
        _apply(path)


@pytest.mark.parametrize(("make", "what"), [
    (lambda d: d, "a folder"),
    (lambda d: (os.mkfifo(d / "fifo.yaml"), d / "fifo.yaml")[1], r"a FIFO \(named pipe\)"),
])
def test_a_config_file_that_is_not_a_file_says_what_it_is(make, what: str, tmp_path: Path) -> None:  # noqa: ANN001
    path = make(tmp_path)
    with pytest.raises(ConfigOverrideError, match=rf"config file '{path}' cannot be read: it is {what}, not a YAML"):
        _apply(path)


def test_an_unreadable_config_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "locked.yaml"
    path.write_text("train: {}\n")

    def refuse(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(ConfigOverrideError, match=r"locked.yaml' cannot be read: Permission denied"):
        _apply(path)


@pytest.mark.parametrize(("override", "message"), [
    ("tr\u0430in.train_iters=3", "unknown config key 'tr\u0430in' (key 'tr\u0430in' contains U+0430 CYRILLIC SMALL "
     "LETTER A at character 3; config keys are ASCII: retype it) (did you mean 'train'?)"),
    ("train.train_\u0456ters=3", "unknown config key 'train.train_\u0456ters' (key 'train_\u0456ters' contains "
     "U+0456 CYRILLIC SMALL LETTER BYELORUSSIAN-UKRAINIAN I at character 7; config keys are ASCII: retype it) "
     "(did you mean 'train.train_iters'?)"),
])
def test_a_look_alike_letter_in_a_key_is_named(override: str, message: str) -> None:
    with pytest.raises(ConfigOverrideError) as info:
        _apply(overrides=[override])
    assert str(info.value) == message


def test_a_look_alike_letter_in_a_yaml_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("optimizer:\n  l\u0433: 0.1\n", encoding="utf-8")
    with pytest.raises(ConfigOverrideError, match="U\\+0433 CYRILLIC SMALL LETTER GHE at character 2"):
        _apply(path)
