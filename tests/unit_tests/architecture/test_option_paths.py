"""docs/architecture.md's "Following an option" table is true: each row's files exist and name the option, the field
file declares it, the rule file holds a rule, and no path needs more than four files (issue 25)."""

import re
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "architecture.md"
PACKAGE = REPO / "src" / "megatron_bridge"
OPTIONS = ("ddp.bucket_cap_mb", "fsdp2.fsdp2_forward_prefetch_depth", "ddp.data_parallel_sharding_strategy",
           "model.pipeline_schedule", "model.cp_comm_type", "model.expert_model_parallel_size")
"""The options issue 25 names; each must have a row per engine."""
ENGINES = ("native", "megatron_core")
_PATH = re.compile(r"`([\w/.]+\.py)`")


def _rows() -> list[list[str]]:
    text = DOC.read_text().split("## Following an option", 1)[1]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| `")]
    assert rows, "no rows under '## Following an option' in docs/architecture.md"
    return rows


def _file(cell: str) -> Path | None:
    m = _PATH.fullmatch(cell)
    if m is None:
        return None
    path = m.group(1)
    return REPO / path if path.startswith("tests/") else PACKAGE / path


def _names(cell: str) -> list[str]:
    return re.findall(r"`([\w.]+)`", cell)


@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"{r[0]}-{r[1]}")
def test_row_is_true(row: list[str]) -> None:
    options, engine, field, rule, backend, test = row
    assert engine in ENGINES, engine
    fields = [name.split(".", 1)[1] for name in _names(options)]
    files = [f for f in map(_file, (field, rule, backend, test)) if f is not None]
    assert len(set(files)) <= 4
    for f in files:
        assert f.is_file(), f"{f} (docs/architecture.md) does not exist"
        text = f.read_text()
        for name in fields:
            assert name in text, f"{f.relative_to(REPO)} does not name {name} (docs/architecture.md row {row[:2]})"
    declared = _file(field).read_text()  # type: ignore[union-attr]
    for name in fields:
        assert re.search(rf"^\s+{name}: ", declared, re.M), f"{field} does not declare {name}"
    if _file(rule) is not None:
        assert "@rule(" in _file(rule).read_text(), f"{rule} holds no rule"  # type: ignore[union-attr]
    else:
        assert _file(backend) is not None, f"{row[:2]}: neither a rule nor a backend file"
    if _file(backend) is None:
        assert "refused" in backend and _file(rule) is not None, f"{row[:2]}: no backend and not refused by a rule"


def test_every_named_option_has_a_row_per_engine() -> None:
    covered = {(name, row[1]) for row in _rows() for name in _names(row[0])}
    missing = [(o, e) for o in OPTIONS for e in ENGINES if (o, e) not in covered]
    assert not missing, f"options without a row in docs/architecture.md's 'Following an option': {missing}"
