"""Reading the library's imports with ``ast``: every ``import`` / ``from ... import`` of a module (module level, inside
functions, under ``TYPE_CHECKING``), resolved to the module of this package it names."""

import ast
from dataclasses import dataclass
from pathlib import Path


SRC = Path(__file__).resolve().parents[3] / "src"
ROOT = "megatron_bridge"


@dataclass(frozen=True)
class Import:
    """One import of a library module by another: where it is written and what it names."""

    importer: str
    imported: str
    file: Path
    line: int
    type_only: bool = False
    """Written under ``if TYPE_CHECKING:`` (an annotation's import: counts for floors, never runs)."""

    def where(self) -> str:
        """``src/megatron_bridge/x/y.py:12``."""
        return f"{self.file.relative_to(SRC.parent)}:{self.line}"


def module_name(path: Path) -> str:
    """``src/megatron_bridge/a/b.py`` → ``megatron_bridge.a.b``; a package's ``__init__.py`` → the package."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library_modules() -> dict[str, Path]:
    """Every module of ``src/megatron_bridge`` by dotted name."""
    return {module_name(p): p for p in sorted((SRC / ROOT).rglob("*.py"))}


def _base(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = importer.split(".") if is_package else importer.split(".")[:-1]
    parts = parts[: len(parts) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def _named(node: ast.AST, importer: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = _base(importer, is_package, node)
        return [f"{base}.{alias.name}" for alias in node.names]
    return []


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The most specific library module a dotted name lies in (``a.b.func`` → ``a.b``), or None outside the library."""
    if name != ROOT and not name.startswith(ROOT + "."):
        return None
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in modules else None


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` blocks."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                inside.update(id(n) for n in ast.walk(child))
    return inside


def imports_of(importer: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """Every import of a library module in one file, wherever it is written, once per line and target."""
    tree = ast.parse(path.read_text(), str(path))
    type_only = _type_checking_nodes(tree)
    out: dict[tuple[str, int], Import] = {}
    for node in ast.walk(tree):
        for name in _named(node, importer, path.name == "__init__.py"):
            target = _resolve(name, modules)
            if target is not None and target != importer:
                out[(target, node.lineno)] = Import(importer, target, path, node.lineno, id(node) in type_only)
    return sorted(out.values(), key=lambda i: (i.line, i.imported))


def all_imports() -> list[Import]:
    """Every import between the library's modules."""
    modules = library_modules()
    return [imp for name, path in modules.items() for imp in imports_of(name, path, modules)]


def package_of(module: str) -> str:
    """The floor a module belongs to: its first-level package (``megatron_bridge.config.rules`` → ``config``), a
    top-level module's own name (``megatron_bridge.errors`` → ``errors``), or ``megatron_bridge`` for the root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]
