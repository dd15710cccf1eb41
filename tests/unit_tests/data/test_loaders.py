"""build_pretraining_data_loaders end to end: mock and file data, blends, data parallelism, resume, validation."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from megatron_bridge.config.data import DatasetConfig, TokenizerConfig
from megatron_bridge.data.blended import BlendedDataset
from megatron_bridge.data.gpt_dataset import GPTDataset
from megatron_bridge.data.loaders import (
    PretrainingDataLoaders,
    build_pretraining_data_loaders,
    build_pretraining_datasets,
    cyclic_iter,
    parse_data_path,
)
from megatron_bridge.data.tokenizers import build_tokenizer
from megatron_bridge.errors import ConfigValidationError, DataError

from .conftest import random_docs


TOK = build_tokenizer(TokenizerConfig(tokenizer_type="byte"))


def _build(cfg: DatasetConfig, **kw: int) -> PretrainingDataLoaders:
    args = dict(micro_batch_size=2, train_samples=40, valid_samples=8, test_samples=0, data_parallel_rank=0,
                data_parallel_size=1)
    args.update(kw)
    return build_pretraining_data_loaders(cfg, TOK, **args)


def test_mock_loaders() -> None:
    loaders = _build(DatasetConfig(mock=True, seq_length=16))
    assert loaders.test is None
    batches = list(loaders.train)
    assert len(batches) == 20
    b = batches[0]
    assert {k: (tuple(v.shape), v.dtype) for k, v in b.items()} == {
        "tokens": ((2, 16), torch.int64),
        "labels": ((2, 16), torch.int64),
        "loss_mask": ((2, 16), torch.float32),
        "position_ids": ((2, 16), torch.int64),
    }
    assert torch.equal(b["tokens"][:, 1:], b["labels"][:, :-1])
    # valid is re-iterable and gives the same batches each time
    first = [x["tokens"] for x in loaders.valid]
    second = [x["tokens"] for x in loaders.valid]
    assert len(first) == 4 and all(torch.equal(a, c) for a, c in zip(first, second))
    cyc = cyclic_iter(loaders.valid)
    seen = [next(cyc)["tokens"] for _ in range(6)]
    assert torch.equal(seen[4], first[0]) and torch.equal(seen[5], first[1])


def test_data_parallel_ranks_and_resume() -> None:
    cfg = DatasetConfig(mock=True, seq_length=8)
    full = [b["tokens"] for b in _build(cfg, data_parallel_rank=1, data_parallel_size=2).train]
    other = [b["tokens"] for b in _build(cfg, data_parallel_rank=0, data_parallel_size=2).train]
    assert len(full) == 10 and not any(torch.equal(a, c) for a, c in zip(full, other))
    resumed = [b["tokens"] for b in _build(cfg, data_parallel_rank=1, data_parallel_size=2,
                                           consumed_train_samples=12).train]
    assert len(resumed) == 7 and all(torch.equal(a, c) for a, c in zip(resumed, full[3:]))


def _files(make_indexed: Callable[..., str]) -> tuple[str, str]:
    return (make_indexed("a", random_docs(60, seed=1, eod=TOK.eod, vocab=256)),
            make_indexed("b", random_docs(60, seed=2, eod=TOK.eod, vocab=256)))


def test_file_loaders_single_and_blend(make_indexed: Callable[..., str]) -> None:
    a, b = _files(make_indexed)
    train, valid, test = build_pretraining_datasets(
        DatasetConfig(mock=False, data_path=[a], seq_length=16, split="80,10,10"), TOK, (40, 5, 3)
    )
    assert isinstance(train, GPTDataset) and len(train) >= 40 and len(valid) >= 5 and len(test) >= 3
    assert train.indexed_indices.tolist() == list(range(48))
    cfg = DatasetConfig(mock=False, data_path=["0.75", a, "0.25", b], seq_length=16, split="80,10,10", num_workers=1)
    loaders = _build(cfg, test_samples=4)
    blend = loaders.train.dataset
    assert isinstance(blend, BlendedDataset) and len(blend) == 40
    assert blend.dataset_index.tolist().count(0) == 30
    batches = list(loaders.train)
    assert len(batches) == 20 and batches[0]["tokens"].shape == (2, 16)
    assert int(torch.cat([x["tokens"] for x in batches]).max()) <= TOK.eod
    assert loaders.test is not None and len(list(loaders.test)) == 2
    unweighted = build_pretraining_datasets(
        DatasetConfig(mock=False, data_path=[a, b], seq_length=16, split="80,10,10"), TOK, (40, 0, 0)
    )[0]
    assert isinstance(unweighted, BlendedDataset) and len(unweighted) >= 40


def test_config_errors(make_indexed: Callable[..., str], tmp_path: Path) -> None:
    a, _ = _files(make_indexed)
    with pytest.raises(ConfigValidationError, match=r"dataset.mock=True and dataset.data_path are both set.*\[rule "
                       r"dataset_source\]"):
        _build(DatasetConfig(mock=True, data_path=[a]))
    with pytest.raises(ConfigValidationError, match="needs dataset.data_path"):
        _build(DatasetConfig(mock=False))
    missing = str(tmp_path / "nowhere")
    with pytest.raises(DataError, match=r"dataset\.data_path.*nowhere\.bin"):
        _build(DatasetConfig(mock=False, data_path=[missing]))
    with pytest.raises(DataError, match="leaves the test split"):
        _build(DatasetConfig(mock=False, data_path=[a], seq_length=16, split="90,10,0"), test_samples=2)
    with pytest.raises(ConfigValidationError, match="mixes weights"):
        parse_data_path(["0.5", a, "x", "y"])
    with pytest.raises(DataError, match="fewer than one global step"):
        _build(DatasetConfig(mock=True, seq_length=8), train_samples=3, micro_batch_size=2, data_parallel_size=2)
    big = make_indexed("big", [[70000, 1, 2] * 10], dtype="int32")
    with pytest.raises(DataError, match="vocab_size"):
        _build(DatasetConfig(mock=False, data_path=[big], seq_length=4, split="1"), valid_samples=0)


def test_parse_data_path() -> None:
    assert parse_data_path(["a", "b"]) == (["a", "b"], None)
    assert parse_data_path(["3", "a", "1", "b"]) == (["a", "b"], [0.75, 0.25])
    assert parse_data_path(["a"]) == (["a"], None)
    with pytest.raises(ConfigValidationError):
        parse_data_path(["1", "a", "-1", "b"])
