"""Every skill is true to the code: anchors hold their symbols, config keys exist, verification test ids exist."""

import re

import pytest
import yaml

from megatron_bridge.utils.anchors import ANCHOR, anchor_ok
from tests.unit_tests.docs.doc_refs import REPO, code_blocks, config_key_exists, is_real_test_id


SKILLS = sorted(p for p in (REPO / "skills").iterdir() if p.is_dir())
EXPECTED = {"megatron-fsdp", "fsdp2", "activation-checkpointing-offloading", "checkpoint-conversion",
            "adding-a-model-recipe", "low-precision", "model-optimization", "multi-node-slurm"}


def test_expected_skills_exist() -> None:
    assert EXPECTED <= {p.name for p in SKILLS}


def _front_matter(text: str) -> dict:
    m = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    assert m, "SKILL.md must start with YAML front matter"
    return yaml.safe_load(m.group(1))


def _section(text: str, title: str) -> str:
    m = re.search(rf"^## {title}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"missing section '## {title}'"
    return m.group(1)


@pytest.mark.parametrize("skill", SKILLS, ids=[p.name for p in SKILLS])
def test_skill_md(skill) -> None:  # noqa: ANN001
    text = (skill / "SKILL.md").read_text()
    front = _front_matter(text)
    assert front["name"] == skill.name
    assert front["description"] and front["when_to_use"]
    for title in ("Enablement", "Code Anchors", "Pitfalls", "Verification"):
        _section(text, title)
    anchors = list(ANCHOR.finditer(_section(text, "Code Anchors")))
    assert anchors, "Code Anchors must cite at least one `path:START-END` `symbol`"
    stale = [a.group(0) for a in anchors
             if not anchor_ok(REPO, a["path"], int(a["start"]), int(a["end"]), a["symbol"])]
    assert not stale, f"stale anchors (run scripts/docs/update_skill_anchors.py): {stale}"
    verification = _section(text, "Verification")
    assert "Success criteria" in verification
    commands = [body for lang, body in code_blocks(verification) if lang == "bash"]
    test_ids = re.findall(r"(tests/\S+\.py::\S+)", "\n".join(commands))
    assert test_ids, "the verification command must name a test id"
    assert all(is_real_test_id(t) for t in test_ids), test_ids


@pytest.mark.parametrize("skill", SKILLS, ids=[p.name for p in SKILLS])
def test_card_yaml(skill) -> None:  # noqa: ANN001
    card = yaml.safe_load((skill / "card.yaml").read_text())
    for key in ("validated_on", "summary", "recommended", "known_constraints", "evidence"):
        assert card.get(key), f"card.yaml needs {key}"
    missing = [k for k in card["recommended"] if not config_key_exists(k)]
    assert not missing, f"recommended keys that are not config fields: {missing}"
    absent = [p for p in card["evidence"] if not (REPO / p).exists()]
    assert not absent, f"evidence paths that do not exist: {absent}"
