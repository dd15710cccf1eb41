"""MockGPTDataset: deterministic, split-dependent, and learnable (arithmetic progressions ending in eod)."""

import numpy as np
import pytest
import torch

from megatron_bridge.data.mock import MockGPTDataset
from megatron_bridge.errors import DataError


def _mock(**kw: object) -> MockGPTDataset:
    args: dict[str, object] = dict(num_samples=50, seq_length=64, vocab_size=258, eod=256, reserved_ids=(257,))
    args.update(kw)
    return MockGPTDataset(**args)  # type: ignore[arg-type]


def test_deterministic_across_instances() -> None:
    a, b = _mock(), _mock()
    for i in range(len(a)):
        for key in ("tokens", "labels", "loss_mask", "position_ids"):
            assert torch.equal(a[i][key], b[i][key])
    assert not torch.equal(a[0]["tokens"], a[1]["tokens"])
    assert not torch.equal(a[0]["tokens"], _mock(random_seed=99)[0]["tokens"])
    assert not torch.equal(a[0]["tokens"], _mock(split_name="valid")[0]["tokens"])


def test_wraps_after_num_distinct() -> None:
    ds = _mock(num_samples=10, num_distinct=3)
    assert torch.equal(ds[0]["tokens"], ds[3]["tokens"]) and torch.equal(ds[2]["tokens"], ds[8]["tokens"])


def test_format_and_learnable_structure() -> None:
    ds = _mock(num_samples=30)
    alphabet = ds.alphabet.tolist()
    pos_of = {t: i for i, t in enumerate(alphabet)}
    m = len(alphabet)
    for i in range(len(ds)):
        s = ds[i]
        assert s["tokens"].shape == (64,) and s["tokens"].dtype == torch.int64
        assert s["loss_mask"].dtype == torch.float32
        text = ds.get_text(i)
        assert torch.equal(s["tokens"], torch.from_numpy(text[:-1]))
        assert torch.equal(s["labels"], torch.from_numpy(text[1:]))
        assert 257 not in text and text.max() <= 256 and text.min() >= 0
        # Every document is an arithmetic progression over the alphabet with a constant step from STEPS.
        docs = np.split(text, np.nonzero(text == 256)[0] + 1)
        for doc in docs:
            body = [pos_of[t] for t in doc.tolist() if t != 256]
            if len(body) >= 3:
                steps = {(b - a) % m for a, b in zip(body, body[1:])}
                assert len(steps) == 1 and steps.pop() in MockGPTDataset.STEPS


def test_eod_masking_and_positions() -> None:
    ds = _mock(eod_mask_loss=True, reset_position_ids=True)
    checked = 0
    for i in range(len(ds)):
        s = ds[i]
        eod = s["tokens"] == 256
        assert torch.equal(s["loss_mask"] == 0, eod)
        expected, p = [], 0
        for t in s["tokens"].tolist():
            expected.append(p)
            p = 0 if t == 256 else p + 1
        assert s["position_ids"].tolist() == expected
        checked += int(eod[:-1].any())
    assert checked > 10


def test_small_vocab_and_bad_args() -> None:
    ds = MockGPTDataset(5, 16, vocab_size=10, eod=9)
    assert ds.alphabet.tolist() == list(range(9))
    with pytest.raises(DataError, match="vocab_size=2"):
        MockGPTDataset(5, 16, vocab_size=2, eod=1)
    with pytest.raises(ValueError, match="num_distinct=0"):
        MockGPTDataset(5, 16, vocab_size=100, eod=99, num_distinct=0)
