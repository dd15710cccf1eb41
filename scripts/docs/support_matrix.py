#!/usr/bin/env python3
"""Write docs/models.md, the support matrix of the model families, from the test suite itself.

A test states what it verifies with ``@pytest.mark.support_cells("mistral:ddp", "mixtral:megatron_fsdp!moe_backend")``:
``family:cell`` is a cell the test checks works (parity with one process, exactness against transformers, bit-exact
resume), ``family:cell!rule`` a cell the test checks is refused by that validation rule. This script reads those
markers from the test files (with ``ast``: nothing is imported or run) and renders the page; a cell no test claims is
empty. ``tests/unit_tests/docs/test_support_matrix.py`` fails when the page differs from what this script writes, and
the tests that claim the cells run in every CI run: the page cannot claim what the suite does not check.

Usage: ``python scripts/docs/support_matrix.py`` (rewrites docs/models.md), ``--check`` (exit 1 when stale).
"""

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "models.md"
COLUMNS: dict[str, str] = {
    "hf": "HF import/export",
    "ddp": "DDP",
    "fsdp2": "FSDP2",
    "megatron_fsdp": "Megatron FSDP",
    "tp": "TP",
    "pp": "PP",
    "cp": "CP",
    "ep": "EP",
    "resume": "resume",
    "megatron_core": "megatron-core engine",
    "gpu": "GPU-verified",
}
"""Cell id → column title, in column order."""
MARKER = "support_cells"


@dataclass(frozen=True)
class Claim:
    """One cell a test claims: the family, the cell, the rule that refuses it (None: it works) and the test."""

    family: str
    cell: str
    rule: str | None
    test: str


def _marker_args(decorator: ast.expr) -> list[str] | None:
    """The string arguments of ``pytest.mark.support_cells(...)``, or None for another decorator."""
    if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
            and decorator.func.attr == MARKER):
        return None
    return [a.value for a in decorator.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]


def claims(tests_root: Path = REPO / "tests") -> list[Claim]:
    """Every cell claimed by a test function under ``tests_root``, in file and line order."""
    out = []
    for path in sorted(tests_root.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        where_file = path.relative_to(tests_root.parent)
        for owner, node in _functions(tree):
            test = f"{where_file}::{owner}::{node.name}" if owner else f"{where_file}::{node.name}"
            for decorator in node.decorator_list:
                for arg in _marker_args(decorator) or []:
                    where, _, rule = arg.partition("!")
                    family, _, cell = where.partition(":")
                    out.append(Claim(family, cell, rule or None, test))
    return out


def _functions(tree: ast.Module) -> list[tuple[str | None, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(class name or None, function) of the module's test functions and its test classes' methods."""
    out: list[tuple[str | None, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out.append((None, node))
        elif isinstance(node, ast.ClassDef):
            out += [(node.name, f) for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
    return out


def problems(found: list[Claim], families: list[str]) -> list[str]:
    """Claims naming an unknown family or cell."""
    return [f"{c.test}: {c.family}:{c.cell} — family must be one of {families}, cell one of {list(COLUMNS)}"
            for c in found if c.family not in families or c.cell not in COLUMNS]


def render(found: list[Claim], families: list[tuple[str, str, str]]) -> str:
    """The page: ``families`` is (name, HF architecture, summary) per registered family."""
    lines = [
        "# Model families: what is verified",
        "",
        "Written by `scripts/docs/support_matrix.py` from the test suite's own markers "
        "(`@pytest.mark.support_cells`); `tests/unit_tests/docs/test_support_matrix.py` keeps this page equal to "
        "them, and every test named here runs in CI. ✓: the test checks it works (exact against transformers, "
        "within 1e-5 of one process per step, or bit-exact resume); *refused*: the test checks that `validate()` "
        "refuses it by the named rule; empty: not verified by a test (it may still work). GPU-verified cells come "
        "from runs on a GPU, none recorded yet. Adding a family: `docs/models/adding-a-family.md`.",
        "",
        "| family | HF architecture | " + " | ".join(COLUMNS.values()) + " |",
        "|---|---|" + "---|" * len(COLUMNS),
    ]
    for name, arch, _ in families:
        cells = []
        for cell in COLUMNS:
            mine = [c for c in found if c.family == name and c.cell == cell]
            works = [c for c in mine if c.rule is None]
            cells.append("✓" if works else (f"refused (`{mine[0].rule}`)" if mine else ""))
        lines.append(f"| `{name}` | `{arch}` | " + " | ".join(cells) + " |")
    lines += ["", "## The tests behind each cell", ""]
    for name, _, summary in families:
        mine = [c for c in found if c.family == name]
        lines.append(f"- **`{name}`** ({summary}):")
        if not mine:
            lines.append("  none yet.")
        for test in dict.fromkeys(c.test for c in mine):
            what = [COLUMNS[c.cell] + (" (refused)" if c.rule else "") for c in mine if c.test == test]
            lines.append(f"  `{test}`: {', '.join(what)}.")
    return "\n".join(lines) + "\n"


def registered_families() -> list[tuple[str, str, str]]:
    """(name, first HF architecture, summary) of every registered family (torch-free)."""
    sys.path.insert(0, str(REPO / "src"))
    from megatron_bridge.config.families import all_families

    return [(s.name, s.hf_architectures[0], s.summary) for s in all_families()]


def main() -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/models.md is stale")
    args = parser.parse_args()
    families = registered_families()
    found = claims()
    bad = problems(found, [name for name, _, _ in families])
    if bad:
        print("\n".join(bad), file=sys.stderr)
        return 1
    text = render(found, families)
    if args.check:
        return 0 if PAGE.exists() and PAGE.read_text() == text else 1
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
