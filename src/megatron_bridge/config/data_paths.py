"""How ``dataset.split`` and ``dataset.data_path`` are read: pure functions (no numpy, no files) shared by the
rules ``dataset_split`` and ``dataset_data_path`` of ``validate()`` and by the data loaders, so both read the
fields one way and the loaders never re-check them (they call :func:`~megatron_bridge.config.rules.enforce`).

Each ``*_problem`` function returns what is wrong (None: nothing); the parsers assume the field passed its rule.
"""

import math
import re
from collections.abc import Sequence


_SPLIT = re.compile(r"[0-9.]+(\s*[,/]\s*[0-9.]+){0,2}")


def split_problem(split: str) -> str | None:
    """What is wrong with ``dataset.split`` (up to 3 non-negative numbers, not all 0), or None."""
    text = split.strip()
    if not text or not _SPLIT.fullmatch(text):
        return f"dataset.split={split!r} is not a list of up to 3 non-negative numbers like '969,30,1'"
    try:
        parts = [float(p) for p in re.split(r"\s*[,/]\s*", text)]
    except ValueError as exc:  # e.g. "1.2.3"
        return f"dataset.split={split!r}: {exc}; write numbers like '969,30,1'"
    if sum(parts) <= 0:
        return f"dataset.split={split!r} has no positive part: give the train split a share, e.g. '969,30,1'"
    return None


def parse_split(split: str) -> list[float]:
    """Normalized train/valid/test proportions of a valid split string such as ``"969,30,1"`` (missing parts 0)."""
    parts = [float(p) for p in re.split(r"\s*[,/]\s*", split.strip())]
    parts += [0.0] * (3 - len(parts))
    total = sum(parts)
    return [p / total for p in parts]


def _as_float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def weights_problem(weights: Sequence[float], what: str = "dataset.data_path weights") -> str | None:
    """What is wrong with blend weights (each finite and >= 0, not all 0), or None."""
    w = [float(x) for x in weights]
    if any(not math.isfinite(x) or x < 0 for x in w) or sum(w) <= 0:
        return f"{what} {w} must be finite, non-negative and not all zero"
    return None


def normalize_weights(weights: Sequence[float]) -> list[float]:
    """Valid weights divided by their sum."""
    w = [float(x) for x in weights]
    total = sum(w)
    return [x / total for x in w]


def data_path_problems(data_path: Sequence[str]) -> list[str]:
    """What is wrong with ``dataset.data_path`` (prefixes, or alternating weight, prefix pairs)."""
    items = [str(x).strip() for x in data_path]
    if not items or any(not x for x in items):
        return [f"dataset.data_path={list(data_path)!r} has an empty entry: give .bin/.idx prefixes"]
    weights = [_as_float(w) for w in items[0::2]]
    if len(items) % 2 or not any(w is not None for w in weights):
        return []
    if any(w is None for w in weights):
        return [f"dataset.data_path={list(data_path)!r} mixes weights and prefixes; give either only prefixes or "
                "alternating weight, prefix pairs such as ['0.7', 'a', '0.3', 'b']"]
    problem = weights_problem([w for w in weights if w is not None])
    return [f"{problem} (dataset.data_path={list(data_path)!r})"] if problem else []


def parse_data_path(data_path: Sequence[str]) -> tuple[list[str], list[float] | None]:
    """Prefixes and (normalized) weights of a valid ``dataset.data_path``: ``["a", "b"]`` or
    ``["0.7", "a", "0.3", "b"]``."""
    items = [str(x).strip() for x in data_path]
    weights = [_as_float(w) for w in items[0::2]]
    if len(items) % 2 == 0 and all(w is not None for w in weights):
        return items[1::2], normalize_weights([w for w in weights if w is not None])
    return items, None
