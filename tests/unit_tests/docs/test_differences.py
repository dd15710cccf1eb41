"""docs/megatron-bridge-differences.md is in step with the code: what it names exists, and every field docstring that
declares a difference from Megatron-Bridge has a row."""

import ast
import dataclasses
import inspect
import re
import textwrap
import typing

from megatron_bridge.config.adjustments import ADJUSTMENTS
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.rule_set import RULES  # registers every rule
from tests.unit_tests.docs.doc_refs import REPO, _dataclass_of, config_key_exists


DOC = REPO / "docs" / "megatron-bridge-differences.md"
MARKER = "Differs from Megatron-Bridge"


def _rows() -> list[list[str]]:
    lines = DOC.read_text().split("| Megatron-Bridge | here | why | where |", 1)[1].splitlines()[2:]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines if line.startswith("|")]


def _where(row: list[str]) -> list[str]:
    return re.findall(r"`([^`]+)`", row[3])


def _field_docstrings(cls: type, prefix: str = "") -> dict[str, str]:
    """Dotted path → attribute docstring of every field of ``cls`` and its nested config dataclasses."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, following in zip(body, body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(following, ast.Expr):
            if isinstance(following.value, ast.Constant) and isinstance(following.value.value, str):
                docs[f"{prefix}{node.target.id}"] = following.value.value
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        nested = _dataclass_of(hints[f.name])
        if nested is not None:
            docs.update(_field_docstrings(nested, f"{prefix}{f.name}."))
    return docs


DOCSTRINGS = _field_docstrings(ConfigContainer)
IDS = {r.id for r in RULES} | {a.id for a in ADJUSTMENTS}


def test_the_table_has_rows() -> None:
    rows = _rows()
    assert len(rows) >= 10 and all(len(row) == 4 and all(row) for row in rows), rows


def test_everything_the_table_names_exists() -> None:
    for row in _rows():
        assert _where(row), f"row without a `where`: {row}"
        for ref in _where(row):
            if "/" in ref:
                assert (REPO / ref).exists(), ref
            elif "." in ref:
                assert config_key_exists(ref), ref
            else:
                assert ref in IDS, f"{ref} is not a registered rule or adjustment"


def test_named_fields_document_the_difference() -> None:
    for row in _rows():
        for ref in _where(row):
            if "." in ref and "/" not in ref and ref in DOCSTRINGS and ref != "ddp.bucket_cap_mb":
                assert "Megatron-Bridge" in DOCSTRINGS[ref], f"{ref}'s docstring does not mention Megatron-Bridge"


def test_every_declared_difference_has_a_row() -> None:
    named = {ref for row in _rows() for ref in _where(row)}
    declared = {path for path, doc in DOCSTRINGS.items() if MARKER in " ".join(doc.split())}
    assert len(declared) >= 8, declared
    assert declared <= named, f"fields declaring a difference without a row: {sorted(declared - named)}"


def test_removed_option_stays_removed() -> None:
    assert not config_key_exists("dist.use_tp_pp_dp_mapping")
