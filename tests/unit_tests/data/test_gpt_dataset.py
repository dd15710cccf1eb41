"""GPTDataset: samples span documents, labels shift, masks, epochs, splits, caching.

The document/sample/shuffle indices and every sample were checked outside CI to be identical to megatron-core
0.16.1's GPTDataset for three seeds, sequence lengths and splits, multi-epoch runs included (see test_indexed.py).
"""

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from megatron_bridge.data.gpt_dataset import GPTDataset, build_sample_index, parse_split, split_ranges
from megatron_bridge.data.indexed import IndexedDataset
from megatron_bridge.errors import ConfigValidationError, DataError

from .conftest import random_docs


EOD = 999


def _dataset(prefix: str, num_samples: int | None, seq: int = 8, **kw: object) -> GPTDataset:
    ds = IndexedDataset(prefix)
    return GPTDataset(ds, np.arange(len(ds)), num_samples, seq_length=seq, random_seed=kw.pop("seed", 1), eod=EOD, **kw)


def test_samples_are_consecutive_windows_of_the_shuffled_stream(make_indexed: Callable[..., str]) -> None:
    docs = random_docs(30, seed=0, eod=EOD)
    gpt = _dataset(make_indexed("w", docs), num_samples=None, seq=8)
    stream = np.concatenate([docs[d] for d in gpt.document_index])
    assert len(gpt) == (len(stream) - 1) // 8
    inverse = np.argsort(gpt.shuffle_index)
    for j in range(len(gpt)):
        sample = gpt[int(inverse[j])]
        window = torch.from_numpy(stream[j * 8 : j * 8 + 9].astype(np.int64))
        assert torch.equal(sample["tokens"], window[:-1])
        assert torch.equal(sample["labels"], window[1:])
    assert sorted(gpt.document_index.tolist()) == list(range(30))


def test_sample_format_masks_and_positions(make_indexed: Callable[..., str]) -> None:
    docs = [[1, 2, 3, EOD], [4, 5, EOD], [6, 7, 8, 9, 10, EOD]]
    gpt = _dataset(make_indexed("m", docs), num_samples=None, seq=12, eod_mask_loss=True, reset_position_ids=True)
    assert len(gpt) == 1
    s = gpt[0]
    assert {k: (v.dtype, tuple(v.shape)) for k, v in s.items()} == {
        "tokens": (torch.int64, (12,)),
        "labels": (torch.int64, (12,)),
        "loss_mask": (torch.float32, (12,)),
        "position_ids": (torch.int64, (12,)),
    }
    tokens = s["tokens"].tolist()
    stream = sum((docs[d] for d in gpt.document_index), [])
    assert tokens == stream[:12] and s["labels"].tolist() == stream[1:13]
    eod_at = [i for i, t in enumerate(tokens) if t == EOD]
    assert s["loss_mask"].tolist() == [0.0 if i in eod_at else 1.0 for i in range(12)]
    expected_pos, p = [], 0
    for t in tokens:
        expected_pos.append(p)
        p = 0 if t == EOD else p + 1
    assert s["position_ids"].tolist() == expected_pos
    plain = _dataset(make_indexed("m2", docs), num_samples=None, seq=12)[0]
    assert plain["loss_mask"].eq(1).all() and plain["position_ids"].tolist() == list(range(12))


def test_epochs_cover_requested_samples(make_indexed: Callable[..., str]) -> None:
    docs = random_docs(10, seed=1, eod=EOD)
    tokens = sum(map(len, docs))
    prefix = make_indexed("e", docs)
    one = _dataset(prefix, num_samples=None, seq=8)
    want = 3 * len(one) + 5
    gpt = _dataset(prefix, num_samples=want, seq=8)
    epochs = -(-(want * 8 + 1) // tokens)
    assert len(gpt) >= want
    assert len(gpt.document_index) == epochs * 10
    assert np.bincount(gpt.document_index).tolist() == [epochs] * 10
    assert sorted(gpt.shuffle_index.tolist()) == list(range(len(gpt)))
    for i in range(len(gpt)):
        assert gpt[i]["tokens"].shape == (8,)


def test_deterministic_and_seeded(make_indexed: Callable[..., str]) -> None:
    prefix = make_indexed("d", random_docs(20, seed=2, eod=EOD))
    a, b = _dataset(prefix, 50, seed=5), _dataset(prefix, 50, seed=5)
    c = _dataset(prefix, 50, seed=6)
    assert all(torch.equal(a[i]["tokens"], b[i]["tokens"]) for i in range(len(a)))
    assert not all(torch.equal(a[i]["tokens"], c[i]["tokens"]) for i in range(len(a)))


def test_cache_dir_round_trip(make_indexed: Callable[..., str], tmp_path: Path) -> None:
    prefix = make_indexed("c", random_docs(20, seed=3, eod=EOD))
    cache = tmp_path / "cache"
    a = _dataset(prefix, 40, cache_dir=str(cache))
    assert len(list(cache.glob("*.npy"))) == 3
    b = _dataset(prefix, 40, cache_dir=str(cache))
    assert isinstance(b.shuffle_index, np.memmap)
    assert all(torch.equal(a[i]["tokens"], b[i]["tokens"]) for i in range(len(a)))
    _dataset(prefix, 41, cache_dir=str(cache))
    assert len(list(cache.glob("*.npy"))) == 6


def test_too_small_split(make_indexed: Callable[..., str]) -> None:
    with pytest.raises(DataError, match="too few"):
        _dataset(make_indexed("s", [[1, 2, EOD]]), 1, seq=8)


def test_sample_index_boundaries() -> None:
    # Document lengths 3, 0, 5 in this order; seq_length 2: samples start at tokens 0, 2, 4, 6.
    idx = build_sample_index(np.array([3, 0, 5], dtype=np.int32), np.array([0, 1, 2], dtype=np.int32), 2, 3)
    assert idx.tolist() == [[0, 0], [0, 2], [2, 1], [2, 3]]


def test_split_parsing() -> None:
    assert split_ranges("969,30,1", 1000) == [(0, 969), (969, 999), (999, 1000)]
    assert split_ranges("98,2,0", 100) == [(0, 98), (98, 100), None]
    assert split_ranges("1", 7) == [(0, 7), None, None]
    assert split_ranges("80/10/10", 10) == [(0, 8), (8, 9), (9, 10)]
    assert parse_split(" 2, 1 ,1") == [0.5, 0.25, 0.25]
    for bad in ("", "a,b", "1,2,3,4", "-1,2", "0,0,0"):
        with pytest.raises(ConfigValidationError, match="dataset.split"):
            parse_split(bad)


def test_indices_that_cannot_fit_the_memory_are_refused_before_allocation(
        make_indexed: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 45, item 7: ``train.train_iters=2**31-1`` asked numpy for tens of GiB; now a DataError comes first."""
    from megatron_bridge.data import gpt_dataset

    prefix = make_indexed("huge", random_docs(20, seed=3, eod=EOD))
    allocations: list[int] = []
    build = gpt_dataset.build_document_index
    monkeypatch.setattr(gpt_dataset, "build_document_index", lambda *a: (allocations.append(1), build(*a))[1])
    monkeypatch.setattr(gpt_dataset, "available_memory_bytes", lambda: 64 * 2**30)  # a 64 GiB machine
    with pytest.raises(DataError, match=r"train split of .*huge' is asked for 34359738352 samples .*building its "
                       r"indices needs about \d+\.\d GiB, more than the 64.0 GiB of memory available. Fix: lower "
                       r"train.train_iters"):
        _dataset(prefix, (2**31 - 1) * 16)
    assert allocations == []
    monkeypatch.setattr(gpt_dataset, "available_memory_bytes", lambda: 10 * 2**20)  # 10 MiB left
    with pytest.raises(DataError, match="more than the 0.0 GiB of memory available"):
        _dataset(prefix, 200_000)
    assert allocations == []
    monkeypatch.setattr(gpt_dataset, "available_memory_bytes", lambda: None)  # no /proc/meminfo: not checked
    assert len(_dataset(prefix, 200_000)) >= 200_000 and allocations  # built (recursively, in epochs)
