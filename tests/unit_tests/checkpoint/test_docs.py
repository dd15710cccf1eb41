"""docs/training/checkpointing.md names only fields, files and tests that exist."""

import dataclasses
import re
from pathlib import Path

from megatron_bridge.config.checkpoint import CheckpointConfig


REPO = Path(__file__).resolve().parents[3]
DOC = (REPO / "docs" / "training" / "checkpointing.md").read_text()


def test_config_table_lists_every_checkpoint_field():
    section = DOC.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    documented = {name for cell in re.findall(r"^\| (`[^|]+`) \|", section, flags=re.M)
                  for name in re.findall(r"`([a-z_]+)`", cell)}
    assert documented == {f.name for f in dataclasses.fields(CheckpointConfig)}


def test_named_tests_exist():
    tests = REPO / "tests"
    for name in set(re.findall(r"`(?:[a-z_]+/)*(test_[a-z0-9_]+\.py)(?:::|`)", DOC)):
        assert list(tests.rglob(name)), name
    for func in set(re.findall(r"::(test_[a-z0-9_]+)", DOC)) | set(re.findall(r"`(test_[a-z0-9_]+)`", DOC)):
        assert any(f"def {func}(" in p.read_text() for p in tests.rglob("test_*.py")), func


def test_named_modules_exist():
    package = REPO / "src" / "megatron_bridge" / "checkpoint"
    for module in re.findall(r"^\| `([a-z_]+\.py)` \|", DOC, flags=re.M):
        assert (package / module).is_file(), module
