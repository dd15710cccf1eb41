"""Build the train/valid/test datasets and DataLoaders of GPT pretraining from ``cfg.dataset``."""

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.data import DatasetConfig
from megatron_bridge.config.data_paths import parse_data_path as config_parse_data_path
from megatron_bridge.config.rule_set import enforce
from megatron_bridge.config.rules_data import DATASET_RULES
from megatron_bridge.data.blended import (
    MID_LEVEL_DATASET_SURPLUS,
    BlendedDataset,
    normalize_weights,
    samples_per_dataset,
)
from megatron_bridge.data.gpt_dataset import SPLIT_NAMES, GPTDataset, split_ranges
from megatron_bridge.data.indexed import IndexedDataset, bin_path_of, idx_path_of, indexed_dataset_exists
from megatron_bridge.data.mock import MockGPTDataset
from megatron_bridge.data.samplers import PretrainingSampler
from megatron_bridge.data.tokenizers import Tokenizer
from megatron_bridge.data.zigzag import ContextParallelCollate
from megatron_bridge.errors import DataError
from megatron_bridge.utils.logging import get_logger, log_rank_0
from megatron_bridge.utils.paths import file_problem


logger = get_logger(__name__)
T = TypeVar("T")


@dataclass
class PretrainingDataLoaders:
    """The three DataLoaders of a pretraining run (None for a split with 0 samples).

    Every loader yields dicts of ``[micro_batch_size, seq_length]`` tensors (``tokens``, ``labels``, ``loss_mask``,
    ``position_ids``) for this data-parallel rank (``seq_length / CP`` tokens, its zig-zag slice, under context
    parallelism). ``train`` starts at ``consumed_train_samples``.

    ``valid`` and ``test`` are plain, re-iterable DataLoaders: every ``iter(valid)`` starts again at
    ``consumed_valid_samples``, so evaluations that each take ``eval_iters`` batches from a fresh iterator score the
    same samples (comparable losses). For Megatron's behaviour (each evaluation continues where the previous one
    stopped and wraps around at the end) keep one ``cyclic_iter(valid)`` for the whole run.
    """

    train: DataLoader | None
    valid: DataLoader | None
    test: DataLoader | None


def cyclic_iter(iterable: Iterable[T]) -> Iterator[T]:
    """Iterate ``iterable`` forever, starting it again each time it is exhausted (Megatron's ``cyclic_iter``)."""
    while True:
        empty = True
        for item in iterable:
            empty = False
            yield item
        if empty:
            raise DataError("cyclic_iter: the iterable yields nothing")


def parse_data_path(data_path: list[str]) -> tuple[list[str], list[float] | None]:
    """Prefixes and (normalized) weights of ``dataset.data_path``: ``["a", "b"]`` or ``["0.7", "a", "0.3", "b"]``.

    Raises:
        ConfigValidationError: rule ``dataset_data_path``.
    """
    enforce(ConfigContainer.holding(DatasetConfig(mock=False, data_path=list(data_path))), "dataset_data_path")
    return config_parse_data_path(data_path)


def _open_indexed(prefix: str) -> IndexedDataset:
    if not indexed_dataset_exists(prefix):
        bad = next(p for p in (bin_path_of(prefix), idx_path_of(prefix)) if not os.path.isfile(p))
        raise DataError(
            f"dataset.data_path entry {prefix!r}: {bad!r} {file_problem(bad)}; data_path entries are prefixes of "
            ".bin/.idx pairs (e.g. out/corpus_text_document), written by scripts/data/preprocess_data.py."
        )
    return IndexedDataset(prefix)


def _gpt_split(cfg: DatasetConfig, indexed: IndexedDataset, split: int, num_samples: int, eod: int) -> GPTDataset:
    rng = split_ranges(cfg.split, len(indexed))[split]
    name = SPLIT_NAMES[split]
    if rng is None or rng[1] <= rng[0]:
        raise DataError(
            f"{num_samples} {name} samples are requested but dataset.split={cfg.split!r} leaves the {name} split of "
            f"{indexed.path_prefix!r} ({len(indexed)} sequences) empty; give it a share in dataset.split or request "
            f"0 {name} samples."
        )
    return GPTDataset(
        indexed,
        np.arange(rng[0], rng[1], dtype=np.int32),
        num_samples,
        seq_length=cfg.seq_length,
        random_seed=cfg.random_seed,
        eod=eod,
        split_name=name,
        reset_position_ids=cfg.reset_position_ids,
        eod_mask_loss=cfg.eod_mask_loss,
        cache_dir=cfg.cache_dir,
    )


def build_pretraining_datasets(
    dataset_cfg: DatasetConfig, tokenizer: Tokenizer, sizes: tuple[int, int, int]
) -> tuple[Dataset | None, Dataset | None, Dataset | None]:
    """The train, valid and test datasets for ``sizes`` samples each (None where the size is 0).

    Mock data when ``dataset_cfg.mock``; else the indexed files of ``dataset_cfg.data_path``, blended by their
    weights (by their token counts when no weights are given).
    """
    enforce(ConfigContainer.holding(dataset_cfg), *DATASET_RULES)
    for name, n in zip(SPLIT_NAMES, sizes):
        if n < 0:
            raise ValueError(f"{name}_samples={n} must be >= 0")
    if dataset_cfg.mock:
        return tuple(  # type: ignore[return-value]
            MockGPTDataset(
                n,
                dataset_cfg.seq_length,
                tokenizer.vocab_size,
                tokenizer.eod,
                random_seed=dataset_cfg.random_seed,
                split_name=name,
                num_distinct=dataset_cfg.mock_num_samples,
                reserved_ids=(tokenizer.pad,),
                reset_position_ids=dataset_cfg.reset_position_ids,
                eod_mask_loss=dataset_cfg.eod_mask_loss,
            )
            if n > 0
            else None
            for name, n in zip(SPLIT_NAMES, sizes)
        )
    prefixes, weights = config_parse_data_path(dataset_cfg.data_path or [])  # DATASET_RULES checked it
    indexed = [_open_indexed(p) for p in prefixes]
    for ds in indexed:
        _check_vocab(ds, tokenizer.vocab_size)
    out: list[Dataset | None] = []
    for split, n in enumerate(sizes):
        if n == 0:
            out.append(None)
            continue
        if len(indexed) == 1:
            out.append(_gpt_split(dataset_cfg, indexed[0], split, n, tokenizer.eod))
            continue
        w = weights
        if w is None:
            token_counts = []
            for ds in indexed:
                rng = split_ranges(dataset_cfg.split, len(ds))[split]
                token_counts.append(int(ds.sequence_lengths[rng[0] : rng[1]].sum()) if rng else 0)
            w = normalize_weights(token_counts)
        per_ds = samples_per_dataset(w, n, surplus=MID_LEVEL_DATASET_SURPLUS)
        members = [_gpt_split(dataset_cfg, ds, split, k, tokenizer.eod) for ds, k in zip(indexed, per_ds)]
        blend_size = sum(samples_per_dataset(w, n))
        out.append(BlendedDataset(members, w, blend_size))
    return out[0], out[1], out[2]


#: Tokens per chunk of the id range scan (bounds the memory the scan touches at once).
VOCAB_CHECK_CHUNK_TOKENS = 1 << 26


def token_id_range(ds: IndexedDataset) -> tuple[int, int] | None:
    """(min, max) token id of the whole ``.bin`` file, a vectorised scan of the memory map in chunks (≈ the disk
    read speed; None for an empty file)."""
    tokens = ds.tokens
    if tokens.size == 0:
        return None
    lo, hi = None, None
    for start in range(0, tokens.size, VOCAB_CHECK_CHUNK_TOKENS):
        chunk = tokens[start : start + VOCAB_CHECK_CHUNK_TOKENS]
        c_lo, c_hi = int(chunk.min()), int(chunk.max())
        lo = c_lo if lo is None else min(lo, c_lo)
        hi = c_hi if hi is None else max(hi, c_hi)
    return lo, hi  # type: ignore[return-value]


def _check_vocab(ds: IndexedDataset, vocab_size: int) -> None:
    """Every token id of every file must be an integer in ``[0, vocab_size)`` (checked for every file, whatever its
    size)."""
    if not np.issubdtype(ds.dtype, np.integer):
        raise DataError(
            f"dataset.data_path entry {ds.path_prefix!r} stores {ds.dtype} values, not token ids (an integer type): "
            "it is not a token dataset; write one with scripts/data/preprocess_data.py"
        )
    found = token_id_range(ds)
    if found is None:
        return
    lo, hi = found
    if lo < 0:
        raise DataError(
            f"dataset.data_path entry {ds.path_prefix!r} holds the negative token id {lo}; token ids must be in "
            f"[0, {vocab_size}): the file is corrupt or was written with another dtype"
        )
    if hi >= vocab_size:
        raise DataError(
            f"dataset.data_path entry {ds.path_prefix!r} holds token id {hi} >= the tokenizer's vocab_size "
            f"{vocab_size}; was it preprocessed with another tokenizer?"
        )


def _loader(
    dataset: Dataset | None, cfg: DatasetConfig, consumed: int, micro_batch_size: int, rank: int, size: int,
    cp: tuple[int, int] = (1, 0),
) -> DataLoader | None:
    if dataset is None:
        return None
    sampler = PretrainingSampler(
        total_samples=len(dataset),  # type: ignore[arg-type]
        consumed_samples=consumed,
        micro_batch_size=micro_batch_size,
        data_parallel_rank=rank,
        data_parallel_size=size,
        drop_last=True,
    )
    if len(sampler) == 0 and consumed == 0:
        raise DataError(
            f"the dataset has {len(dataset)} samples, fewer than one global step of micro_batch_size * "  # type: ignore[arg-type]
            f"data_parallel_size = {micro_batch_size * size}"
        )
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=cfg.num_workers,
        pin_memory=cfg.pin_memory and torch.cuda.is_available(),
        persistent_workers=cfg.num_workers > 0,
        collate_fn=ContextParallelCollate(*cp) if cp[0] > 1 else None,
    )


def build_pretraining_data_loaders(
    dataset_cfg: DatasetConfig,
    tokenizer: Tokenizer,
    *,
    micro_batch_size: int,
    train_samples: int,
    valid_samples: int,
    test_samples: int,
    data_parallel_rank: int,
    data_parallel_size: int,
    consumed_train_samples: int = 0,
    consumed_valid_samples: int = 0,
    context_parallel_size: int = 1,
    context_parallel_rank: int = 0,
) -> PretrainingDataLoaders:
    """The train/valid/test DataLoaders of this data-parallel rank (see :class:`PretrainingDataLoaders`).

    Args:
        dataset_cfg: ``cfg.dataset``.
        tokenizer: gives the vocabulary size and the eod id.
        micro_batch_size: samples per rank per step.
        train_samples, valid_samples, test_samples: samples each split must provide, all ranks together
            (e.g. ``train_iters * global_batch_size``); 0 gives no loader for that split.
        data_parallel_rank, data_parallel_size: this rank's place among the data-parallel ranks.
        consumed_train_samples: samples of the train split already consumed (from a checkpoint).
        consumed_valid_samples: samples of the valid split already consumed (taken modulo the split's size).
        context_parallel_size, context_parallel_rank: with CP > 1 every batch entry ``[b, s]`` (tokens, labels,
            loss_mask, position_ids) is cut to this CP rank's zig-zag slice ``[b, s / CP]`` (every CP rank of a
            data-parallel group reads the same samples; see :mod:`megatron_bridge.distributed.context_parallel`).

    Raises:
        ConfigValidationError: a rule of ``DATASET_RULES`` (e.g. mock with data_path, no data_path without mock).
        DataError: missing or corrupt files, splits too small for the requested samples.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size} must be >= 1 (train.micro_batch_size: rule "
                         "positive_sizes)")
    if data_parallel_size < 1 or not 0 <= data_parallel_rank < data_parallel_size:
        raise ValueError(f"data_parallel_rank={data_parallel_rank} must be in [0, data_parallel_size="
                         f"{data_parallel_size})")
    sizes = (train_samples, valid_samples, test_samples)
    train, valid, test = build_pretraining_datasets(dataset_cfg, tokenizer, sizes)
    source = "mock data" if dataset_cfg.mock else f"{dataset_cfg.data_path}"
    log_rank_0(
        logger,
        "datasets from %s: train %s, valid %s, test %s samples",
        source,
        *(len(d) if d is not None else 0 for d in (train, valid, test)),  # type: ignore[arg-type]
    )
    valid_consumed = consumed_valid_samples % len(valid) if valid is not None else 0  # type: ignore[arg-type]
    if context_parallel_size < 1 or not 0 <= context_parallel_rank < context_parallel_size:
        raise ValueError(f"context_parallel_rank={context_parallel_rank} must be in [0, context_parallel_size="
                         f"{context_parallel_size})")
    args = (micro_batch_size, data_parallel_rank, data_parallel_size, (context_parallel_size, context_parallel_rank))
    return PretrainingDataLoaders(
        train=_loader(train, dataset_cfg, consumed_train_samples, *args),
        valid=_loader(valid, dataset_cfg, valid_consumed, *args),
        test=_loader(test, dataset_cfg, 0, *args),
    )
