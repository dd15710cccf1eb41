"""docs/models.md is what scripts/docs/support_matrix.py writes from the tests' ``support_cells`` markers: every
claimed family and cell exists, every registered family has a row, and the page cannot drift from the suite."""

from pathlib import Path

from megatron_bridge.config.families import family_names
from tests.unit_tests.scripts import load_script


REPO = Path(__file__).resolve().parents[3]


def _script():  # noqa: ANN202  (the script's module)
    return load_script("scripts/docs/support_matrix.py")


def test_page_equals_what_the_markers_say() -> None:
    matrix = _script()
    found = matrix.claims()
    assert not matrix.problems(found, family_names())
    expected = matrix.render(found, matrix.registered_families())
    assert (REPO / "docs" / "models.md").read_text() == expected, "run: python scripts/docs/support_matrix.py"


def test_every_family_has_a_row_and_the_claims_are_real_tests() -> None:
    matrix = _script()
    page = (REPO / "docs" / "models.md").read_text()
    for name in family_names():
        assert f"| `{name}` |" in page
    for claim in matrix.claims():
        path, *_, func = claim.test.split("::")
        assert f"def {func}(" in (REPO / path).read_text()


def test_claims_are_read_from_markers_only(tmp_path: Path) -> None:
    """A marker with a refusal, one that works, and an unknown family are read as written."""
    matrix = _script()
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n\n@pytest.mark.support_cells(\"mistral:ddp\", \"mixtral:megatron_fsdp!moe_backend\")\n"
        "def test_a():\n    pass\n\n\n@pytest.mark.support_cells(\"nope:tp\")\ndef test_b():\n    pass\n")
    found = matrix.claims(tmp_path)
    assert [(c.family, c.cell, c.rule) for c in found] == [("mistral", "ddp", None),
                                                          ("mixtral", "megatron_fsdp", "moe_backend"),
                                                          ("nope", "tp", None)]
    assert len(matrix.problems(found, ["mistral", "mixtral"])) == 1
    page = matrix.render(found[:2], [("mistral", "MistralForCausalLM", "s"), ("mixtral", "MixtralForCausalLM", "t")])
    assert "| `mistral` | `MistralForCausalLM` |  | ✓ |" in page
    assert "refused (`moe_backend`)" in page
