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


def _engine_name(name: object) -> bool:
    return isinstance(name, str) and (name == "engine" or name.endswith("_engine"))


def _reads_engine(node: ast.AST) -> bool:
    """``<anything>.engine`` (or ``.<x>_engine``, e.g. a backend's ``checkpoint_engine``), ``getattr(x, "engine",
    ...)`` (the same names) or a call of a helper named ``_engine``."""
    if isinstance(node, ast.Attribute) and _engine_name(node.attr):
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "_engine":
            return True
        return node.func.id == "getattr" and any(isinstance(a, ast.Constant) and _engine_name(a.value)
                                                 for a in node.args[1:2])
    return False


def engine_copies(tree: ast.AST) -> set[str]:
    """Names that hold a copy of the engine's name: ``engine = cfg.model.engine``, ``e: str = ...``, ``(e := ...)``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr) and node.value is not None \
                and _reads_engine(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def engine_comparisons(source: str) -> list[int]:
    """Lines of the comparisons (``==``, ``!=``, ``in``, ...) whose operands read the engine's name, directly or
    through a local copy of it (:func:`engine_copies`)."""
    tree = ast.parse(source)
    copies = engine_copies(tree)

    def reads(node: ast.AST) -> bool:
        if isinstance(node, ast.NamedExpr):
            node = node.value
        return _reads_engine(node) or isinstance(node, ast.Name) and node.id in copies

    return sorted(node.lineno for node in ast.walk(tree)
                  if isinstance(node, ast.Compare) and any(reads(n) for n in (node.left, *node.comparators)))


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
              "c = getattr(cfg.model, 'engine', 'native') == 'x'\nd = _engine(cfg) == 'x'\ne = cfg.model.engine\n"
              "f = getattr(backend, 'checkpoint_engine', None) == 'megatron_core'\n")
    assert engine_comparisons(source) == [1, 2, 3, 4, 6]


def test_comparison_counter_sees_local_copies_of_the_engine() -> None:
    source = ("def f(cfg):\n    engine = cfg.model.engine\n    other = 'native' if engine == 'megatron_core' else 'x'\n"
              "    if (e := cfg.model.engine) in ('a', 'b'):\n        pass\n    name: str = cfg.model.engine\n"
              "    return name != 'native', engine\n")
    assert engine_copies(ast.parse(source)) == {"engine", "e", "name"}
    assert engine_comparisons(source) == [3, 4, 7]
    the_interface = "engine = get_engine(cfg)\nengine.name\nx = engine.checkpoint.megatron_core_format\n"
    assert engine_comparisons(the_interface) == []


def test_no_local_copy_of_the_engine_is_compared_outside_config_and_factory() -> None:
    copies = {rel: sorted(engine_copies(ast.parse((SRC.parent / rel).read_text()))) for rel in _counts()}
    assert not copies, f"files comparing model.engine (or a local copy of it; copies per file): {copies}"


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_only_the_factory_imports_both_engines() -> None:
    targets: dict[str, set[str]] = {name: set() for name in library_modules()}
    for imp in all_imports():
        targets[imp.importer].add(imp.imported)
    both = [name for name, imported in targets.items() if name != "megatron_bridge.engines.factory"
            and any(_within(t, NATIVE) for t in imported) and any(_within(t, MEGATRON_CORE) for t in imported)]
    assert not both, f"modules importing both the native and the megatron-core implementation of a step: {both}"


def test_each_engine_declares_its_checkpoint_side() -> None:
    """The checkpoint package reads the format from ``Engine.checkpoint``, never from the engine's name."""
    from megatron_bridge.engines.megatron_core.engine import MegatronCoreEngine
    from megatron_bridge.engines.native.engine import NativeEngine

    native, mcore = NativeEngine(), MegatronCoreEngine()
    assert (native.checkpoint.other_engine, mcore.checkpoint.other_engine) == (mcore.name, native.name)
    assert not native.checkpoint.megatron_core_format and mcore.checkpoint.megatron_core_format
    assert (native.checkpoint.convert_target, mcore.checkpoint.convert_target) == ("megatron", "megatron_core")
