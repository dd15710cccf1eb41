"""The engine seam: ``model.engine`` is compared only by the config rules and the engine factory, and no module but the
factory imports both engines' implementations."""

import ast

from tests.unit_tests.architecture.imports import SRC, all_imports, library_modules


ALLOWED_FILES = {"src/megatron_bridge/engines/factory.py"}
"""Besides the config floor (``src/megatron_bridge/config/``), where the rules read ``model.engine``."""

NATIVE = ("megatron_bridge.engines.native", "megatron_bridge.models.provider", "megatron_bridge.distributed.pipeline",
          "megatron_bridge.distributed.ddp", "megatron_bridge.distributed.fsdp2",
          "megatron_bridge.distributed.megatron_fsdp")
"""The native engine's implementations of the steps both engines have: model, pipeline, backends, optimizer."""
MEGATRON_CORE = ("megatron_bridge.engines.megatron_core",)


def _reads_engine(node: ast.AST) -> bool:
    """``<anything>.engine``, ``getattr(x, "engine", ...)`` or a call of a helper named ``_engine``."""
    if isinstance(node, ast.Attribute) and node.attr == "engine":
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "_engine":
            return True
        return node.func.id == "getattr" and any(isinstance(a, ast.Constant) and a.value == "engine"
                                                 for a in node.args[1:2])
    return False


def engine_comparisons(source: str) -> list[int]:
    """Lines of the comparisons (``==``, ``!=``, ``in``, ...) whose operands read the engine's name."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_reads_engine(n) for n in (node.left, *node.comparators)):
            lines.append(node.lineno)
    return lines


def _counts() -> dict[str, list[int]]:
    found = {}
    for path in sorted((SRC / "megatron_bridge").rglob("*.py")):
        rel = str(path.relative_to(SRC.parent))
        if rel.startswith("src/megatron_bridge/config/") or rel in ALLOWED_FILES:
            continue
        lines = engine_comparisons(path.read_text())
        if lines:
            found[rel] = lines
    return found


def test_no_engine_comparison_outside_config_and_factory() -> None:
    found = _counts()
    assert not found, f"model.engine compared outside config/ and engines/factory.py (file → lines): {found}"


def test_comparison_counter_sees_the_forms_in_use() -> None:
    source = ("a = cfg.model.engine == 'megatron_core'\nb = config.engine != 'native'\n"
              "c = getattr(cfg.model, 'engine', 'native') == 'x'\nd = _engine(cfg) == 'x'\ne = cfg.model.engine\n")
    assert engine_comparisons(source) == [1, 2, 3, 4]


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_only_the_factory_imports_both_engines() -> None:
    targets: dict[str, set[str]] = {name: set() for name in library_modules()}
    for imp in all_imports():
        targets[imp.importer].add(imp.imported)
    both = [name for name, imported in targets.items() if name != "megatron_bridge.engines.factory"
            and any(_within(t, NATIVE) for t in imported) and any(_within(t, MEGATRON_CORE) for t in imported)]
    assert not both, f"modules importing both the native and the megatron-core implementation of a step: {both}"
