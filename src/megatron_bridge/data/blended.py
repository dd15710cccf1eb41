"""Weighted blends of datasets, with megatron-core's greedy, deterministic assignment of samples to datasets."""

import math
from collections.abc import Sequence

import numpy as np
import torch

from megatron_bridge.config.data_paths import normalize_weights as config_normalize_weights
from megatron_bridge.config.data_paths import weights_problem
from megatron_bridge.errors import DataError
from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)

#: Extra fraction of samples each blended dataset is built with (megatron-core's ``mid_level_dataset_surplus``).
MID_LEVEL_DATASET_SURPLUS = 0.005


def normalize_weights(weights: Sequence[float]) -> list[float]:
    """Weights divided by their sum.

    Raises:
        DataError: negative, non-finite or all-zero weights (``dataset.data_path``'s weights are checked by rule
            ``dataset_data_path``; these are the weights a blend is built with, e.g. the datasets' token counts).
    """
    problem = weights_problem(weights, "blend weights")
    if problem:
        raise DataError(f"{problem}: give each blended dataset some tokens and a weight >= 0")
    return config_normalize_weights(weights)


def samples_per_dataset(weights: Sequence[float], size: int, surplus: float = 0.0) -> list[int]:
    """Samples to request from each dataset for a blend of ``size``: ``ceil(ceil(size * w) * (1 + surplus))``."""
    return [int(math.ceil(math.ceil(size * w) * (1 + surplus))) for w in weights]


def build_blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Which dataset, and which of its samples, each of ``size`` blended samples comes from.

    At step ``i`` the dataset whose count lags ``weight * max(i, 1)`` the most is taken (the first one on ties), as
    megatron-core's ``helpers.build_blending_indices`` does.

    Returns:
        ``(dataset_index int16 [size], dataset_sample_index int64 [size])``.
    """
    w = np.asarray(weights, dtype=np.float64)
    dataset_index = np.zeros(size, dtype=np.int16)
    dataset_sample_index = np.zeros(size, dtype=np.int64)
    if len(w) == 1:
        dataset_sample_index[:] = np.arange(size)
        return dataset_index, dataset_sample_index
    wl = w.tolist()
    current = [0] * len(wl)
    k = range(1, len(wl))
    for i in range(size):
        x = float(max(i, 1))
        best = 0
        best_err = wl[0] * x - current[0]
        for d in k:
            err = wl[d] * x - current[d]
            if err > best_err:
                best, best_err = d, err
        dataset_index[i] = best
        dataset_sample_index[i] = current[best]
        current[best] += 1
    return dataset_index, dataset_sample_index


class BlendedDataset(torch.utils.data.Dataset):
    """``size`` samples drawn from ``datasets`` in the proportions ``weights`` (normalized), deterministically.

    Items are the underlying datasets' items unchanged (no ``dataset_id`` key is added, so batches of blended and
    single datasets have the same keys).
    """

    def __init__(self, datasets: Sequence[torch.utils.data.Dataset], weights: Sequence[float], size: int) -> None:
        if len(datasets) != len(weights) or not datasets:
            raise ValueError(f"{len(datasets)} datasets but {len(weights)} weights")
        if size < 0:
            raise ValueError(f"blend size must be >= 0, got {size}")
        self.datasets = list(datasets)
        self.weights = normalize_weights(weights)
        self.size = int(size)
        self.dataset_index, self.dataset_sample_index = build_blending_indices(self.weights, self.size)
        counts = np.bincount(self.dataset_index, minlength=len(self.datasets))
        for i, (count, ds) in enumerate(zip(counts, self.datasets)):
            if count > len(ds):  # type: ignore[arg-type]
                raise DataError(
                    f"the blend takes {count} samples from dataset {i}, which has only {len(ds)}"  # type: ignore[arg-type]
                )
        logger.debug(
            "blend of %d datasets, %d samples, weights %s, achieved %s",
            len(self.datasets),
            self.size,
            [round(x, 4) for x in self.weights],
            [round(int(c) / max(self.size, 1), 4) for c in counts],
        )

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        if not 0 <= idx < self.size:
            raise IndexError(f"sample {idx} out of range for a blend of {self.size} samples")
        return self.datasets[int(self.dataset_index[idx])][int(self.dataset_sample_index[idx])]
