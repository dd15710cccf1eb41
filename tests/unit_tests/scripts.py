"""A command-line script of ``scripts/`` loaded as a module, so a test calls its ``main()`` and helpers in-process."""

import importlib.util
from pathlib import Path
from types import ModuleType


REPO = Path(__file__).resolve().parents[2]


def load_script(path: str | Path) -> ModuleType:
    """The module of ``path`` (relative to the repository root, or absolute), executed once per call."""
    file = REPO / path
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module
