"""Extracting and resolving what docs and skills name: config keys, repository paths, test ids, code blocks."""

import ast
import dataclasses
import importlib
import re
import types
import typing
from pathlib import Path

from megatron_bridge.config.container import ConfigContainer


REPO = Path(__file__).resolve().parents[3]
SECTIONS = {f.name for f in dataclasses.fields(ConfigContainer)}
PATH_PREFIXES = ("src/", "scripts/", "tests/", "docs/", "data/", "skills/", "requirements/", ".ci/")
CONFIG_KEY = re.compile(r"^(" + "|".join(sorted(SECTIONS)) + r")\.[A-Za-z_][A-Za-z0-9_.]*")
FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```", re.S | re.M)


def doc_files() -> list[Path]:
    """README, every page under docs/ and every SKILL.md."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "skills").rglob("SKILL.md"))]


def inline_code(text: str) -> list[str]:
    """Backticked spans outside fenced blocks."""
    return re.findall(r"`([^`\n]+)`", FENCE.sub("", text))


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block; a ``python fragment`` block has the language "python-fragment"."""
    out = []
    for m in FENCE.finditer(text):
        lang = m.group(1).lower()
        if lang == "python" and "fragment" in m.group(2):
            lang = "python-fragment"
        out.append((lang, m.group(3)))
    return out


def _dataclass_of(tp: object) -> type | None:
    if dataclasses.is_dataclass(tp):
        return tp  # type: ignore[return-value]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if dataclasses.is_dataclass(arg):
                return arg
    return None


def config_key_exists(key: str) -> bool:
    """True if ``key`` (``section.field[.field]``) is a field path of ConfigContainer, or a Megatron-Bridge key the
    loader moves to one (``train.eval_iters``: megatron_bridge.config.deprecated)."""
    from megatron_bridge.config.deprecated import MOVED_KEYS

    if key in MOVED_KEYS:
        return config_key_exists(MOVED_KEYS[key])
    cls: type | None = ConfigContainer
    for part in key.split("."):
        if cls is None:
            return False
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return False
        cls = _dataclass_of(hints[part])
    return True


def config_keys_in(span: str) -> list[str]:
    """Config keys named in a code span (``a.b=c``, ``a.b: c``, ``cfg.a.b``); calls (``dist.new_group(``) and file
    names (``model.py``) are not keys."""
    keys = []
    pattern = r"(?<![\w./-])(?:cfg\.)?((?:" + "|".join(sorted(SECTIONS)) + r")\.[A-Za-z_][\w.]*)(?![\w(/-])"
    for m in re.finditer(pattern, span):
        key = m.group(1).rstrip(".")
        if key.endswith(_FILE_SUFFIXES) or key.startswith(_NOT_KEYS):
            continue
        keys.append(key)
    return keys


_FILE_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".json", ".pt", ".txt", ".png", ".safetensors")
_NOT_KEYS = ("model.layers", "model.embed_tokens", "model.norm", "model.safetensors")


def repo_paths_in(span: str) -> list[str]:
    """Repository paths named in a span (without ::test ids or :line ranges)."""
    out = []
    for token in span.split():
        token = token.strip("'\",;()")
        if token.startswith(PATH_PREFIXES):
            out.append(re.split(r"::|:(?=\d)", token)[0].rstrip("/").rstrip("."))
    return out


def is_real_test_id(test_id: str) -> bool:
    """``tests/x.py::Class::test`` or ``tests/x.py::test`` names a real test function."""
    path, *names = test_id.split("::")
    file = REPO / path
    if not file.is_file():
        return False
    tree = ast.parse(file.read_text())
    scope: list[ast.stmt] = tree.body
    for name in names:
        name = name.split("[")[0]
        node = next((n for n in scope if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name == name), None)
        if node is None:
            return False
        scope = node.body if isinstance(node, ast.ClassDef) else []
    return True


def python_names_resolve(code: str) -> list[str]:
    """Parse a Python snippet and import every ``from X import a`` / ``import X``; returns the failures."""
    failures = []
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            try:
                module = importlib.import_module(node.module)
            except ImportError as exc:
                failures.append(f"import {node.module}: {exc}")
                continue
            failures += [f"{node.module}.{a.name}" for a in node.names if not hasattr(module, a.name)
                         and not _is_submodule(node.module, a.name)]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                try:
                    importlib.import_module(alias.name)
                except ImportError as exc:
                    failures.append(f"import {alias.name}: {exc}")
    return failures


def _is_submodule(module: str, name: str) -> bool:
    try:
        importlib.import_module(f"{module}.{name}")
        return True
    except ImportError:
        return False


def makefile_targets() -> set[str]:
    """Targets declared in the Makefile."""
    return set(re.findall(r"^([A-Za-z][\w-]*):", (REPO / "Makefile").read_text(), flags=re.M))
