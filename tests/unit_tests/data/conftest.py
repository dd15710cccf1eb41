"""Shared helpers of the data tests: small indexed datasets written to tmp_path."""

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from megatron_bridge.data.indexed import IndexedDatasetBuilder


def write_indexed(prefix: Path | str, docs: Sequence[Sequence[int]], dtype: type = np.uint16) -> str:
    """Write ``docs`` (one sequence each) as ``<prefix>.bin/.idx``; returns the prefix as str."""
    prefix = str(prefix)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype)
    for doc in docs:
        builder.add_document(list(doc))
    builder.finalize(prefix + ".idx")
    return prefix


@pytest.fixture
def make_indexed(tmp_path: Path) -> Callable[..., str]:
    """``make_indexed(name, docs, dtype=np.uint16) -> prefix`` under tmp_path."""

    def make(name: str, docs: Sequence[Sequence[int]], dtype: type = np.uint16) -> str:
        return write_indexed(tmp_path / name, docs, dtype)

    return make


def random_docs(n: int, seed: int, eod: int, vocab: int = 200, max_len: int = 40) -> list[list[int]]:
    """``n`` documents of random length (1..max_len) with random ids below ``vocab``, each ending with ``eod``."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=int(rng.integers(1, max_len))).tolist() + [eod] for _ in range(n)]
