"""Megatron indexed dataset files: round trips, the exact byte layout, and corrupt files.

Compatibility with megatron-core was verified outside CI (megatron-core 0.16.1 in a separate venv, which cannot share
this project's environment): for uint8/uint16/int32/int64 tokens, including documents made of several sequences, our
IndexedDatasetBuilder and mcore's wrote byte-identical .bin and .idx files, mcore's IndexedDataset read ours and ours
read mcore's with identical sequences, document indices and get(idx, offset, length). The same check found our
GPTDataset indices/samples and blending indices identical to mcore's (see test_gpt_dataset.py, test_blended.py).
Rerun it with scripts/data/check_megatron_core_compat.py. This file pins the layout by hand, so CI needs no mcore.
"""

import os
import pickle
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from megatron_bridge.data.indexed import IndexedDataset, IndexedDatasetBuilder, optimal_dtype
from megatron_bridge.errors import DataError


DOCS = [[1, 2, 3], [4], [5, 6, 7, 8, 9], [10, 11]]


def test_round_trip(make_indexed: Callable[..., str]) -> None:
    for dtype in (np.uint16, np.int32, np.uint8, np.int64):
        ds = IndexedDataset(make_indexed(f"rt_{np.dtype(dtype).name}", DOCS, dtype))
        assert ds.dtype == np.dtype(dtype)
        assert len(ds) == 4 and ds.num_documents == 4 and ds.num_tokens == 11
        assert [ds[i].tolist() for i in range(4)] == DOCS
        assert ds[-1].tolist() == [10, 11]
        assert ds.get(2, offset=1, length=3).tolist() == [6, 7, 8]
        assert ds.get(2, offset=3).tolist() == [8, 9]
        assert [a.tolist() for a in ds[1:3]] == DOCS[1:3]
        assert ds.sequence_lengths.tolist() == [3, 1, 5, 2]
        assert ds.document_indices.tolist() == [0, 1, 2, 3, 4]
        with pytest.raises(IndexError):
            ds.get(0, offset=2, length=5)
        with pytest.raises(IndexError):
            ds[4]


def test_hand_built_layout(tmp_path: Path) -> None:
    """Our writer's bytes equal the format description (megatron-core's _IndexWriter), built here by hand."""
    prefix = str(tmp_path / "layout")
    builder = IndexedDatasetBuilder(prefix + ".bin", np.uint16)
    builder.add_document([7, 8, 9])
    builder.add_document([300, 301], lengths=[1, 1])  # one document of two sequences
    builder.add_document([])  # an empty document adds no sequence
    builder.add_document([65535])
    builder.finalize(prefix + ".idx")
    expected_idx = (
        b"MMIDIDX\x00\x00"
        + struct.pack("<Q", 1)  # version
        + struct.pack("<B", 8)  # dtype code of uint16
        + struct.pack("<Q", 4)  # sequences
        + struct.pack("<Q", 5)  # document indices (documents + 1)
        + struct.pack("<4i", 3, 1, 1, 1)  # sequence lengths, int32
        + struct.pack("<4q", 0, 6, 8, 10)  # byte pointers, int64
        + struct.pack("<5q", 0, 1, 3, 3, 4)  # document indices, int64
    )
    assert Path(prefix + ".idx").read_bytes() == expected_idx
    assert Path(prefix + ".bin").read_bytes() == struct.pack("<6H", 7, 8, 9, 300, 301, 65535)
    ds = IndexedDataset(prefix)
    assert ds.num_documents == 4 and len(ds) == 4
    assert ds.document_indices.tolist() == [0, 1, 3, 3, 4]


def test_int32_dtype_code(tmp_path: Path) -> None:
    prefix = str(tmp_path / "i32")
    builder = IndexedDatasetBuilder(prefix + ".bin", np.int32)
    builder.add_document([70000])
    builder.finalize(prefix + ".idx")
    assert Path(prefix + ".idx").read_bytes()[17] == 4
    assert Path(prefix + ".bin").read_bytes() == struct.pack("<i", 70000)


def test_optimal_dtype() -> None:
    assert optimal_dtype(258) == np.uint16
    assert optimal_dtype(65499) == np.uint16
    assert optimal_dtype(65500) == np.int32
    assert optimal_dtype(None) == np.int32


def test_writer_rejects_ids_outside_dtype(tmp_path: Path) -> None:
    builder = IndexedDatasetBuilder(str(tmp_path / "x.bin"), np.uint16)
    with pytest.raises(DataError, match="do not fit"):
        builder.add_document([1, 70000])
    with pytest.raises(DataError, match="add up"):
        builder.add_document([1, 2], lengths=[1])
    with pytest.raises(DataError, match="cannot be stored"):
        IndexedDatasetBuilder(str(tmp_path / "y.bin"), np.uint32)


def _corrupt(prefix: str, suffix: str, mutate: Callable[[bytes], bytes]) -> None:
    p = Path(prefix + suffix)
    p.write_bytes(mutate(p.read_bytes()))


@pytest.mark.parametrize(
    ("suffix", "mutate", "message"),
    [
        (".idx", lambda b: b"XXIDIDX\x00\x00" + b[9:], "bad magic"),
        (".idx", lambda b: b[:20], "truncated"),
        (".idx", lambda b: b[:-8], "truncated or corrupt"),
        (".idx", lambda b: b + b"\x00" * 8, "truncated or corrupt"),
        (".idx", lambda b: b[:9] + struct.pack("<Q", 2) + b[17:], "version 2"),
        (".idx", lambda b: b[:17] + b"\x09" + b[18:], "unknown dtype code"),
        (".idx", lambda b: b[:-8] + struct.pack("<q", 7), "document indices"),
        (".idx", lambda b: b[:34] + struct.pack("<i", 2) + b[38:], "sequence pointers|describes"),
        (".bin", lambda b: b[:-2], "truncated or corrupt"),
        (".bin", lambda b: b + b"\x00\x00", "truncated or corrupt"),
    ],
)
def test_corrupt_files(
    make_indexed: Callable[..., str], suffix: str, mutate: Callable[[bytes], bytes], message: str
) -> None:
    prefix = make_indexed("bad", DOCS)
    _corrupt(prefix, suffix, mutate)
    with pytest.raises(DataError, match=message) as info:
        IndexedDataset(prefix)
    assert prefix in str(info.value)


def test_missing_files(make_indexed: Callable[..., str]) -> None:
    prefix = make_indexed("gone", DOCS)
    Path(prefix + ".bin").unlink()
    with pytest.raises(DataError, match=r"gone\.bin.*does not exist"):
        IndexedDataset(prefix)


@pytest.mark.parametrize(("suffix", "make", "what"), [
    (".bin", lambda p: p.mkdir(), "a folder"),
    (".idx", lambda p: os.mkfifo(p), r"a FIFO \(named pipe\)"),
])
def test_a_file_that_is_not_regular_says_what_it_is(suffix: str, make, what: str,  # noqa: ANN001
                                                    make_indexed: Callable[..., str]) -> None:
    prefix = make_indexed(f"odd{suffix[1:]}", DOCS)
    Path(prefix + suffix).unlink()
    make(Path(prefix + suffix))
    with pytest.raises(DataError, match=rf"{suffix}' cannot be read: it is {what}, not a regular file"):
        IndexedDataset(prefix)


@pytest.mark.parametrize("suffix", [".bin", ".idx"])
def test_an_unreadable_file_is_a_data_error(suffix: str, make_indexed: Callable[..., str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``chmod 000`` gives a non-root user (root reads every file, so ``open``/``mmap`` refuse here)."""
    import builtins

    prefix = make_indexed(f"locked{suffix[1:]}", DOCS)
    locked = prefix + suffix
    real_open, real_memmap = builtins.open, np.memmap

    def refuse(path: object) -> None:
        if str(path) == locked:
            raise PermissionError(13, "Permission denied", locked)

    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: (refuse(f), real_open(f, *a, **k))[1])
    monkeypatch.setattr(np, "memmap", lambda f, *a, **k: (refuse(f), real_memmap(f, *a, **k))[1])
    with pytest.raises(DataError, match=rf"{suffix}' cannot be read: Permission denied; check its permissions"):
        IndexedDataset(prefix)


def test_pickle_reopens(make_indexed: Callable[..., str]) -> None:
    ds = IndexedDataset(make_indexed("pk", DOCS))
    clone = pickle.loads(pickle.dumps(ds))
    assert [clone[i].tolist() for i in range(len(clone))] == DOCS


def test_empty_dataset(make_indexed: Callable[..., str]) -> None:
    ds = IndexedDataset(make_indexed("empty", []))
    assert len(ds) == 0 and ds.num_documents == 0 and ds.num_tokens == 0
