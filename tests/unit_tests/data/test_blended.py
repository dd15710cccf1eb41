"""Blends: megatron-core's greedy assignment (identical to mcore 0.16.1's helpers, checked outside CI)."""

import numpy as np
import pytest
import torch

from megatron_bridge.data.blended import BlendedDataset, build_blending_indices, normalize_weights
from megatron_bridge.errors import DataError


class _Const(torch.utils.data.Dataset):
    def __init__(self, value: int, n: int) -> None:
        self.value, self.n = value, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"tokens": torch.tensor([self.value, i])}


@pytest.mark.parametrize("weights", [[0.7, 0.3], [0.2, 0.5, 0.3], [0.01, 0.99], [1.0, 1.0, 1.0, 1.0]])
def test_proportions_track_weights_at_every_prefix(weights: list[float]) -> None:
    w = np.array(normalize_weights(weights))
    size = 2000
    di, dsi = build_blending_indices(w.tolist(), size)
    counts = np.zeros(len(w))
    for i in range(size):
        counts[di[i]] += 1
        assert np.all(np.abs(counts - w * (i + 1)) <= 1.0 + 1e-9)
    # The sample index within each dataset counts up from 0.
    for d in range(len(w)):
        assert dsi[di == d].tolist() == list(range(int((di == d).sum())))


def test_greedy_choice_and_ties() -> None:
    di, _ = build_blending_indices([0.5, 0.5], 6)
    assert di.tolist() == [0, 1, 0, 1, 0, 1]
    di, _ = build_blending_indices([0.25, 0.75], 8)
    assert di.tolist() == [1, 0, 1, 1, 0, 1, 1, 1]  # step 4 ties (0 vs 0): the first dataset wins


def test_blended_dataset_items_and_determinism() -> None:
    blend = BlendedDataset([_Const(0, 100), _Const(1, 100)], [3, 1], 40)
    values = [int(blend[i]["tokens"][0]) for i in range(len(blend))]
    assert values.count(0) == 30 and values.count(1) == 10
    again = BlendedDataset([_Const(0, 100), _Const(1, 100)], [3, 1], 40)
    assert np.array_equal(blend.dataset_index, again.dataset_index)
    with pytest.raises(DataError, match="has only"):
        BlendedDataset([_Const(0, 5), _Const(1, 100)], [1, 1], 40)
    with pytest.raises(DataError, match="non-negative"):
        BlendedDataset([_Const(0, 5)], [-1], 4)
    with pytest.raises(IndexError):
        blend[40]
