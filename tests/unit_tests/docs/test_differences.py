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


def _table(header: str) -> list[list[str]]:
    """The rows of the table under ``header`` (up to the first line that is not a table row)."""
    lines = DOC.read_text().split(header, 1)[1].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _rows() -> list[list[str]]:
    return _table("| Megatron-Bridge | here | why | where |")


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


# ------------------------------------------------------------------------------------ the AutoBridge method table
AUTOBRIDGE_HEADER = "| AutoBridge method | here | why |"
MB_AUTOBRIDGE_METHODS = {
    "list_supported_models", "supports", "from_auto_config", "from_hf_config", "from_hf_pretrained", "can_handle",
    "load_hf_weights", "export_hf_weights", "export_hf_weights_modelopt", "export_hf_weights_quant",
    "export_adapter_weights", "save_hf_adapter", "save_hf_pretrained", "save_hf_weights", "save_megatron_model",
    "load_megatron_model", "import_ckpt", "export_ckpt", "export_adapter_ckpt", "push_to_hub", "get_model_config",
    "get_model", "to_megatron_model", "to_megatron_provider", "get_hf_model_id_from_checkpoint",
    "get_conversion_tasks", "transformer_config", "mla_transformer_config",
}
"""Megatron-Bridge's public AutoBridge methods at 067f987 (src/megatron/bridge/models/conversion/auto_bridge.py)."""


def _method_rows() -> dict[str, tuple[str, str]]:
    rows = _table(AUTOBRIDGE_HEADER)
    assert all(len(row) == 3 and row[0].startswith("`") for row in rows), rows
    return {row[0].strip("`"): (row[1], row[2]) for row in rows}


def _our_public_methods() -> set[str]:
    from megatron_bridge.bridge import AutoBridge

    return {name for name in vars(AutoBridge) if not name.startswith("_")}


def test_method_table_lists_every_megatron_bridge_and_every_our_method() -> None:
    rows = _method_rows()
    assert set(rows) == MB_AUTOBRIDGE_METHODS | _our_public_methods(), sorted(set(rows) ^ (
        MB_AUTOBRIDGE_METHODS | _our_public_methods()))


def test_method_table_rows_are_true() -> None:
    ours = _our_public_methods()
    for name, (here, why) in _method_rows().items():
        assert here in ("ours", "left out"), (name, here)
        assert why, f"{name}: no reason given"
        assert (here == "ours") == (name in ours), f"{name} is marked {here!r}"
