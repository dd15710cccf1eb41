"""Imports only point down: the floors table of docs/architecture.md, checked against every import of every module
(module level, inside functions, under ``TYPE_CHECKING``), and no cycle among the library's modules."""

from tests.unit_tests.architecture.floors import cycle_edges, cycles, floors, upward
from tests.unit_tests.architecture.imports import all_imports, library_modules, package_of


ALLOWED_UPWARD: set[tuple[str, str]] = set()
"""(importer, imported) pairs allowed to import upward: none (a pair added here must say why, and fails the test
once it no longer occurs)."""

ALLOWED_CYCLES: list[list[str]] = []
"""Cycles among modules allowed to stay: none; the same rule."""


def _full(name: str) -> str:
    return f"megatron_bridge.{name}"


def _allowed_upward() -> set[tuple[str, str]]:
    return {(_full(a), _full(b)) for a, b in ALLOWED_UPWARD}


def _allowed_cycles() -> list[list[str]]:
    return [sorted(_full(m) for m in c) for c in ALLOWED_CYCLES]


def test_every_package_has_a_floor() -> None:
    table = floors()
    missing = sorted({package_of(m) for m in library_modules()} - set(table))
    assert not missing, f"packages without a floor in docs/architecture.md: {missing}"


def test_no_upward_import() -> None:
    bad = [i for i in upward(all_imports(), floors()) if (i.importer, i.imported) not in _allowed_upward()]
    assert not bad, "upward imports (see the floors table in docs/architecture.md):\n" + "\n".join(
        f"  {i.where()}: {package_of(i.importer)} imports {i.imported}" for i in bad)


def test_no_cycle_among_modules() -> None:
    imports = all_imports()
    bad = [c for c in cycles(imports) if c not in _allowed_cycles()]
    report = [" ⇄ ".join(c) + "".join(f"\n    {i.where()}: imports {i.imported}" for i in cycle_edges(c, imports))
              for c in bad]
    assert not bad, "import cycles among modules:\n  " + "\n  ".join(report)


def test_allow_lists_only_shrink() -> None:
    imports = all_imports()
    now_up = {(i.importer, i.imported) for i in upward(imports, floors())}
    now_cycles = cycles(imports)
    stale = sorted(_allowed_upward() - now_up) + [c for c in _allowed_cycles() if c not in now_cycles]
    assert not stale, f"fixed, remove from the allow-lists in {__file__}: {stale}"


def test_floor_checks_catch_what_they_should() -> None:
    from pathlib import Path

    from tests.unit_tests.architecture.imports import Import

    f = Path("src/megatron_bridge/x.py")
    down = Import("megatron_bridge.training.loop", "megatron_bridge.config.train", f, 1)
    up = Import("megatron_bridge.config.rules", "megatron_bridge.training.loop", f, 2)
    back = Import("megatron_bridge.config.train", "megatron_bridge.config.rules", f, 3)
    table = {"config": 3, "training": 11}
    assert upward([down, up], table) == [up]
    assert cycles([up, down, back]) == [["megatron_bridge.config.rules", "megatron_bridge.config.train",
                                         "megatron_bridge.training.loop"]]
    assert cycles([down]) == []


def test_family_packages_are_reached_only_through_the_registry() -> None:
    """A lower floor reaches a model family only through config/families.py (the registry imports the family's package
    by the name its registration line gives); no other module below the families names a family package."""
    from pathlib import Path

    from megatron_bridge.config.families import FAMILY_PACKAGES

    src = Path(__file__).resolve().parents[3] / "src" / "megatron_bridge"
    registry = src / "config" / "families.py"
    table = floors()
    offenders = []
    for path in sorted(src.rglob("*.py")):
        package = path.relative_to(src).parts[0].removesuffix(".py")
        if path == registry or package not in table or table[package] >= table["families"]:
            continue
        if "megatron_bridge.families" in path.read_text():
            offenders.append(str(path.relative_to(src)))
    assert not offenders, f"modules below the families floor that name a family package: {offenders}"
    assert all(p == f"megatron_bridge.families.{name}" for name, p in FAMILY_PACKAGES.items())
