"""Whether an optional package (transformer-engine, nvidia-modelopt) really works here, and the CUDA device's
generation. Every check catches any exception, not only ImportError: transformer-engine installed on a machine
without CUDA raises ``RuntimeError`` at import (see /work/shared/reference/engine-feasibility.md), and a
broken package must read as "missing" with its reason, never crash ``validate()``.
"""

import importlib
from functools import cache


@cache
def import_problem(module_name: str) -> str | None:
    """None when ``module_name`` imports; else why not ("not installed" or "ExceptionType: message").

    The import is real (a package found but broken on this machine counts as missing) and cached per process.
    """
    try:
        importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.split(".")[0] == exc.name.split(".")[0]:
            return "not installed"
        return f"ModuleNotFoundError: {exc}"
    except Exception as exc:  # noqa: BLE001 - any failure means the package is unusable here
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{type(exc).__name__}: {first_line}"[:300]
    return None


def package_version(distribution: str) -> str | None:
    """Installed version of a distribution (e.g. "transformer-engine"), None when absent or unreadable."""
    try:
        from importlib.metadata import version

        return version(distribution)
    except Exception:  # noqa: BLE001
        return None


def cuda_capability() -> tuple[int, int] | None:
    """Compute capability of CUDA device 0, None without a usable CUDA device (or torch)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        return tuple(torch.cuda.get_device_capability(0))  # type: ignore[return-value]
    except Exception:  # noqa: BLE001
        return None


def accelerator_available() -> bool:
    """Whether torch sees an accelerator (CUDA, XPU, MPS, ...) here; False without one (or without torch)."""
    try:
        import torch

        return bool(torch.accelerator.is_available())
    except Exception:  # noqa: BLE001
        return False


def version_at_least(found: str | None, minimum: str) -> bool:
    """``found >= minimum`` comparing the numeric release parts ("2.7.0.dev0" counts as 2.7.0)."""
    if found is None:
        return False

    def parts(v: str) -> tuple[int, ...]:
        out = []
        for piece in v.split("+")[0].split("."):
            digits = "".join(ch for ch in piece if ch.isdigit())
            if not digits or not piece[0].isdigit():
                break
            out.append(int(digits))
        return tuple(out)

    return parts(found) >= parts(minimum)
