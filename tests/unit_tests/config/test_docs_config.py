"""docs/training/config-container.md lists exactly the registered rules and adjustments, with their summaries."""

import re
from pathlib import Path

from megatron_bridge.config.adjustments import ADJUSTMENTS
from megatron_bridge.config.rule_set import RULES


DOC = Path(__file__).resolve().parents[3] / "docs" / "training" / "config-container.md"


def _table_ids(text: str, header: str) -> list[str]:
    section = text.split(header, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([a-z0-9_]+)` \|", section, flags=re.M)


def test_rules_table_matches_registry() -> None:
    text = DOC.read_text()
    assert _table_ids(text, "## Validation rules") == [r.id for r in RULES]
    for r in RULES:
        assert r.summary in text, f"summary of rule {r.id} changed: regenerate the table"


def test_adjustments_table_matches_registry() -> None:
    text = DOC.read_text()
    assert _table_ids(text, "## Adjustments made by finalize()") == [a.id for a in ADJUSTMENTS]
    for a in ADJUSTMENTS:
        assert a.summary in text
