"""The README is the entry page: every page under docs/ is reachable from it through Markdown links (directly or via
a linked page), and it holds no commit hashes (measured runs and their history live in docs/)."""

import re
from pathlib import Path

from tests.unit_tests.docs.doc_refs import REPO


README = REPO / "README.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
"""A Markdown link ``[text](target)``; the target's ``#anchor`` is dropped."""
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
"""7 to 40 hex digits with at least one digit and one letter (a short or full commit hash, not a word or a number)."""


def linked_pages(page: Path) -> set[Path]:
    """The local Markdown files ``page`` links to (resolved against its folder)."""
    out = set()
    for target in LINK.findall(page.read_text()):
        path = target.split("#", 1)[0]
        if path and "://" not in path and path.endswith(".md"):
            out.add((page.parent / path).resolve())
    return out


def reachable(start: Path) -> set[Path]:
    """Every Markdown file reachable from ``start`` through links (``start`` included)."""
    seen, todo = set(), [start.resolve()]
    while todo:
        page = todo.pop()
        if page in seen or not page.is_file():
            continue
        seen.add(page)
        todo.extend(linked_pages(page) - seen)
    return seen


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    pages = {p.resolve() for p in (REPO / "docs").rglob("*.md")}
    missing = sorted(str(p.relative_to(REPO)) for p in pages - reachable(README))
    assert pages and not missing, f"docs pages no link path from README.md reaches (link them): {missing}"


def test_readme_links_resolve() -> None:
    broken = sorted(str(p) for p in linked_pages(README) if not p.is_file())
    assert not broken, f"README.md links to missing pages: {broken}"


def test_readme_has_no_commit_hashes() -> None:
    found = COMMIT_HASH.findall(README.read_text())
    assert not found, f"commit hashes in README.md (move measured history to docs/testing.md): {found}"


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.md").write_text("[b](sub/b.md#part) and [web](https://x.org/c.md)")
    (tmp_path / "sub" / "b.md").write_text("[c](../c.md)")
    (tmp_path / "c.md").write_text("end")
    (tmp_path / "d.md").write_text("unlinked")
    assert {p.name for p in reachable(tmp_path / "a.md")} == {"a.md", "b.md", "c.md"}
    text = "at ce17ff1 and 1a2579f0, not 2026, 1234567, deadline, facade or decade"
    assert COMMIT_HASH.findall(text) == ["ce17ff1", "1a2579f0"]
