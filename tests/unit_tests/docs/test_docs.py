"""Docs and skills name only config keys, files, scripts, tests and Python names that exist; code blocks parse."""

import ast
import re
import shlex
import subprocess

import pytest

from tests.functional_tests.launcher import warm_python
from tests.unit_tests.docs.doc_refs import (
    REPO,
    code_blocks,
    config_key_exists,
    config_keys_in,
    doc_files,
    inline_code,
    is_real_test_id,
    makefile_targets,
    python_names_resolve,
    repo_paths_in,
)


DOCS = doc_files()
IDS = [str(p.relative_to(REPO)) for p in DOCS]


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_config_keys_exist(doc) -> None:  # noqa: ANN001
    text = doc.read_text()
    spans = inline_code(text) + [body for lang, body in code_blocks(text) if lang in ("yaml", "bash", "python", "")]
    missing = sorted({k for span in spans for k in config_keys_in(span) if not config_key_exists(k)})
    assert not missing, f"{doc.name} names config keys that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_repository_paths_exist(doc) -> None:  # noqa: ANN001
    text = doc.read_text()
    spans = inline_code(text) + [body for _, body in code_blocks(text)]
    missing = sorted({p for span in spans for p in repo_paths_in(span) if not (REPO / p).exists()})
    assert not missing, f"{doc.name} names files that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_cited_test_ids_exist(doc) -> None:  # noqa: ANN001
    text = doc.read_text()
    tokens = [t.strip("'\",;()") for span in inline_code(text) for t in span.split()]
    cited = {t for t in tokens if t.startswith("tests/") and "::" in t}
    missing = sorted(t for t in cited if not is_real_test_id(t))
    assert not missing, f"{doc.name} cites tests that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_python_blocks_parse_and_resolve(doc) -> None:  # noqa: ANN001
    for lang, body in code_blocks(doc.read_text()):
        if lang not in ("python", "python-fragment"):
            continue
        ast.parse(body)
        assert not python_names_resolve(body), f"{doc.name}: unresolved {python_names_resolve(body)}"


PYTHON_BLOCKS = [(doc, i, body) for doc in DOCS for i, (lang, body) in enumerate(code_blocks(doc.read_text()))
                 if lang == "python"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("doc", "index", "body"), PYTHON_BLOCKS,
                         ids=[f"{d.relative_to(REPO)}#{i}" for d, i, _ in PYTHON_BLOCKS])
def test_python_blocks_run(doc, index: int, body: str, tmp_path) -> None:  # noqa: ANN001
    """Every ``python`` block runs as written, as a script of its own in an empty folder (launcher.py's
    ``warm_python``). Blocks that only illustrate an interface are fenced ``python fragment`` and are parsed and
    resolved instead."""
    (tmp_path / "block.py").write_text(body)
    python, env = warm_python()
    proc = subprocess.run([python, "block.py"], cwd=tmp_path, capture_output=True, text=True, timeout=280, env=env)
    assert proc.returncode == 0, f"{doc.name} block {index} failed:\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_commands_name_real_scripts_tests_and_targets(doc) -> None:  # noqa: ANN001
    problems = []
    for lang, body in code_blocks(doc.read_text()):
        if lang not in ("bash", "sh", "shell", "console"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip().removeprefix("$ ")
            if not line or line.startswith("#"):
                continue
            words = shlex.split(line)
            problems += _check_command(words)
    assert not problems, f"{doc.name}: {problems}"


def _check_command(words: list[str]) -> list[str]:
    problems = []
    while words and "=" in words[0] and not words[0].startswith("-"):  # leading VAR=value
        words = words[1:]
    if not words:
        return problems
    if words[0] == "make":
        problems += [f"make target {t!r}" for t in words[1:2] if t not in makefile_targets()]
    for i, w in enumerate(words):
        if w.endswith(".py") and w.startswith(("scripts/", "tests/")) and not (REPO / w).is_file():
            problems.append(f"script {w}")
        if "::" in w and w.startswith("tests/") and not is_real_test_id(w):
            problems.append(f"test id {w}")
        if w == "--recipe" and i + 1 < len(words):
            from megatron_bridge.recipes import RECIPES

            if words[i + 1] not in RECIPES:
                problems.append(f"recipe {words[i + 1]}")
    return problems


def _dry_commands() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for lang, body in code_blocks(doc.read_text()):
            if lang not in ("bash", "sh", "shell"):
                continue
            for line in body.replace("\\\n", " ").splitlines():
                line = line.split(" #", 1)[0].strip()
                if re.search(r"--dry-?run\b|--help\b", line) and re.match(r"(\.venv/bin/)?python3? ", line):
                    out.append((str(doc.relative_to(REPO)), line))
    return out


DRY_COMMANDS = _dry_commands()


@pytest.mark.parametrize(("doc", "command"), DRY_COMMANDS, ids=[f"{d}:{c[:60]}" for d, c in DRY_COMMANDS])
def test_dry_run_commands_run(doc: str, command: str) -> None:
    """Commands that only print (``--dry-run``, ``--dryrun``, ``--help``) are run as written."""
    words = shlex.split(command)
    python, env = warm_python()
    proc = subprocess.run([python, *words[1:]], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, f"{doc}: `{command}` failed:\n{proc.stderr[-3000:]}"
