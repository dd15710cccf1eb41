"""The floors of ``src/megatron_bridge``, read from the table in docs/architecture.md (the one place they are written),
and what breaks them: upward imports and cycles among modules."""

import re
from collections import defaultdict
from pathlib import Path

from tests.unit_tests.architecture.imports import Import, package_of


DOC = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"
_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`([\w.]+)`")


def floors() -> dict[str, int]:
    """Package → floor number, from the floors table of docs/architecture.md (``| 3 | `config` | ...``)."""
    table = {}
    for line in DOC.read_text().splitlines():
        m = _ROW.match(line)
        if m:
            table[m.group(2).removesuffix("/").split("/")[0]] = int(m.group(1))
    return table


def upward(imports: list[Import], table: dict[str, int]) -> list[Import]:
    """Imports of a package on the same or a higher floor than the importer's own (other than itself)."""
    out = []
    for imp in imports:
        a, b = package_of(imp.importer), package_of(imp.imported)
        if a != b and table[b] >= table[a]:
            out.append(imp)
    return out


def cycles(imports: list[Import]) -> list[list[str]]:
    """Strongly connected sets of two or more modules (Tarjan), each sorted; the list sorted. Imports that run count
    (module level and inside functions); those under ``TYPE_CHECKING`` never run, so they close no circle."""
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        if not imp.type_only:
            graph[imp.importer].add(imp.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def cycle_edges(component: list[str], imports: list[Import]) -> list[Import]:
    """The imports that stay inside one cycle (what to cut), in file order."""
    members = set(component)
    return sorted((i for i in imports if i.importer in members and i.imported in members and not i.type_only),
                  key=lambda i: (str(i.file), i.line))
