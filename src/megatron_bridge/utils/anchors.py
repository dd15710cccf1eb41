"""Code anchors of skills: ``path:START-END`` line ranges that must hold a named symbol.

Skills cite code as ``- `src/pkg/mod.py:10-42` `symbol` — what it is``. ``find_symbol`` locates a ``def``/``class``
(``Class.method`` or ``Class.field`` too) with ast; ``scripts/docs/update_skill_anchors.py`` rewrites stale ranges and
``tests/unit_tests/docs/test_skills.py`` fails when a range no longer holds its symbol.
"""

import ast
import re
from pathlib import Path


ANCHOR = re.compile(r"`(?P<path>[\w./-]+\.py):(?P<start>\d+)-(?P<end>\d+)` `(?P<symbol>[\w.]+)`")


def find_symbol(source: str, symbol: str) -> tuple[int, int] | None:
    """First and last line of ``symbol`` (``name`` or ``Class.member``) in ``source``, or None."""
    scope: list[ast.stmt] = ast.parse(source).body
    node: ast.stmt | None = None
    for part in symbol.split("."):
        node = next((n for n in scope if _name_of(n) == part), None)
        if node is None:
            return None
        scope = node.body if isinstance(node, ast.ClassDef) else []
    assert node is not None
    start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return start, node.end_lineno or node.lineno


def _name_of(node: ast.stmt) -> str | None:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


def anchor_ok(repo: Path, path: str, start: int, end: int, symbol: str) -> bool:
    """True when the file exists and lines start..end contain the whole symbol."""
    file = repo / path
    if not file.is_file():
        return False
    span = find_symbol(file.read_text(), symbol)
    return span is not None and start <= span[0] and span[1] <= end


def refresh_anchors(text: str, repo: Path) -> str:
    """Rewrite every anchor's line range to the symbol's current position (unknown symbols stay as they are)."""

    def fix(m: re.Match[str]) -> str:
        file = repo / m["path"]
        span = find_symbol(file.read_text(), m["symbol"]) if file.is_file() else None
        if span is None:
            return m.group(0)
        return f"`{m['path']}:{span[0]}-{span[1]}` `{m['symbol']}`"

    return ANCHOR.sub(fix, text)
