"""The environment the Makefile builds: Python 3.12 found as a user's machine has it, and pins that agree."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[3]
FIND = REPO / "scripts" / "env" / "find_python.sh"


def _find(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "PYENV_ROOT": str(tmp_path / "no-pyenv")}
    return subprocess.run(["bash", str(FIND)], env={**base, **env}, capture_output=True, text=True, timeout=60)


def _fake_python(path: Path, version: str) -> Path:
    """A script that answers like a Python ``version`` interpreter to the checks find_python.sh runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    major, minor = version.split(".")[:2]
    path.write_text(f"#!/bin/sh\nexec {sys.executable} -c \"import sys; sys.version_info = ({major}, {minor}); "
                    f"sys.executable = '{path}'; exec(sys.argv[1])\" \"$2\"\n")
    path.chmod(0o755)
    return path


def test_explicit_python_of_another_version_is_refused(tmp_path: Path) -> None:
    out = _find(tmp_path, PYTHON=str(_fake_python(tmp_path / "bin" / "python3.11", "3.11")))
    assert out.returncode == 1 and out.stdout == ""
    assert "is not a working Python 3.12 interpreter" in out.stderr and "PYTHON=" in out.stderr


def test_explicit_python_of_the_right_version_is_used(tmp_path: Path) -> None:
    fake = _fake_python(tmp_path / "bin" / "python3.12", "3.12")
    out = _find(tmp_path, PYTHON=str(fake))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(fake)


def test_python312_on_path_wins_over_a_shim_that_fails(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    shim = bin_dir / "python3"
    shim.parent.mkdir(parents=True)
    shim.write_text("#!/bin/sh\necho 'pyenv: python3: command not found' >&2\nexit 127\n")  # an inactive pyenv shim
    shim.chmod(0o755)
    fake = _fake_python(bin_dir / "python3.12", "3.12")
    out = _find(tmp_path, PATH=f"{bin_dir}:/usr/bin:/bin")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(fake)


def test_pyenv_versions_are_searched(tmp_path: Path) -> None:
    fake = _fake_python(tmp_path / "pyenv" / "versions" / "3.12.9" / "bin" / "python", "3.12")
    out = _find(tmp_path, PATH="/usr/bin:/bin", PYENV_ROOT=str(tmp_path / "pyenv"))
    if out.stdout.strip() and out.stdout.strip() != str(fake):  # the system itself has a 3.12 on /usr/bin
        pytest.skip(f"/usr/bin has Python 3.12 ({out.stdout.strip()}), found first")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(fake)


def test_no_interpreter_names_the_fixes(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = subprocess.run(["/bin/bash", str(FIND)], capture_output=True, text=True, timeout=60,
                         env={"PATH": str(empty), "HOME": str(tmp_path), "PYENV_ROOT": str(tmp_path / "none")})
    assert out.returncode == 1 and out.stdout == ""
    for fix in ("pyenv install 3.12", "uv python install 3.12", "python3.12-venv", "PYTHON="):
        assert fix in out.stderr


def test_the_makefile_recreates_a_venv_of_another_version() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert "scripts/env/find_python.sh" in makefile
    assert "PY_VERSION := 3.12" in makefile
    assert "rm -rf $(VENV)" in makefile and ".installed-py$(PY_VERSION)-" in makefile


def test_pins_agree_with_the_interpreter() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    pins = (REPO / "requirements" / "cpu.txt").read_text()
    assert 'requires-python = ">=3.12"' in pyproject
    core = re.search(r'"megatron-core==([\d.]+)"', pyproject)
    assert core is not None and f"megatron-core=={core.group(1)}" in pins
    assert "torch==2.13.0" in pins
