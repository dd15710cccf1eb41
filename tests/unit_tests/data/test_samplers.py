"""PretrainingSampler: per-rank contiguous slices of each global batch, exact resume."""

import pytest

from megatron_bridge.data.samplers import PretrainingSampler
from megatron_bridge.errors import DataError


def _batches(total: int, consumed: int, mbs: int, rank: int, dp: int, drop_last: bool = True) -> list[list[int]]:
    return list(PretrainingSampler(total, consumed, mbs, rank, dp, drop_last))


def test_contiguous_slices_like_megatron() -> None:
    assert _batches(12, 0, 2, 0, 2) == [[0, 1], [4, 5], [8, 9]]
    assert _batches(12, 0, 2, 1, 2) == [[2, 3], [6, 7], [10, 11]]
    assert _batches(13, 0, 2, 1, 2) == [[2, 3], [6, 7], [10, 11]]  # the incomplete last group is dropped


def test_ranks_disjoint_and_cover_every_full_step() -> None:
    total, mbs, dp = 103, 3, 4
    per_rank = [_batches(total, 0, mbs, r, dp) for r in range(dp)]
    flat = [i for batches in per_rank for b in batches for i in b]
    assert len(flat) == len(set(flat))
    assert sorted(flat) == list(range((total // (mbs * dp)) * mbs * dp))
    assert all(len(b) == mbs for batches in per_rank for b in batches)
    assert all(len(PretrainingSampler(total, 0, mbs, r, dp)) == len(per_rank[r]) for r in range(dp))


@pytest.mark.parametrize("steps_done", [0, 1, 5, 16])
def test_resume_matches_uninterrupted_run(steps_done: int) -> None:
    total, mbs, dp = 200, 4, 3
    for rank in range(dp):
        full = _batches(total, 0, mbs, rank, dp)
        resumed = _batches(total, steps_done * mbs * dp, mbs, rank, dp)
        assert resumed == full[steps_done:]


def test_no_drop_last_gives_partial_batches() -> None:
    assert _batches(10, 0, 2, 0, 2, drop_last=False) == [[0, 1], [4, 5], [8, 9]]
    assert _batches(10, 0, 2, 1, 2, drop_last=False) == [[2, 3], [6, 7]]
    assert len(PretrainingSampler(10, 0, 2, 1, 2, drop_last=False)) == 2


def test_finished_and_invalid() -> None:
    assert _batches(8, 8, 2, 0, 2) == []
    with pytest.raises(DataError, match="consumed_samples"):
        PretrainingSampler(8, 9, 2, 0, 2)
    with pytest.raises(DataError, match="no samples"):
        PretrainingSampler(0, 0, 2, 0, 2)
    with pytest.raises(DataError, match="data_parallel_rank"):
        PretrainingSampler(8, 0, 2, 2, 2)
    with pytest.raises(DataError, match="micro_batch_size"):
        PretrainingSampler(8, 0, 0, 0, 2)
