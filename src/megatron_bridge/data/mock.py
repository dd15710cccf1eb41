"""MockGPTDataset: deterministic, learnable synthetic samples (no files needed).

Every sample is a run of short "documents", each an arithmetic progression ``alphabet[(start + step * j) % m]``
with a random start, a step from :data:`MockGPTDataset.STEPS` and a random length, followed by the eod token.
After two tokens of a document the rest is predictable, so a tiny model's loss drops clearly within a few hundred
steps (from ``ln(vocab)`` to well under 1), which makes the mock data useful for convergence smoke tests.
"""

import numpy as np
import torch

from megatron_bridge.data.gpt_dataset import SPLIT_NAMES, sample_from_tokens
from megatron_bridge.errors import DataError


class MockGPTDataset(torch.utils.data.Dataset):
    """``num_samples`` synthetic samples in the dict format of :class:`~megatron_bridge.data.gpt_dataset.GPTDataset`.

    Sample ``i`` depends only on ``(random_seed, split, i % num_distinct)``: the same on every rank and every run,
    and a different stream for each split.

    Args:
        num_samples: length of the dataset.
        seq_length: tokens per sample.
        vocab_size: the tokenizer's vocabulary size.
        eod: end-of-document id (appended after every progression).
        random_seed: seed of the token streams.
        split_name: "train", "valid" or "test".
        num_distinct: distinct samples before the data repeats (``dataset.mock_num_samples``).
        reserved_ids: ids never used inside a progression besides eod (e.g. the pad id).
        reset_position_ids: restart position ids after every eod.
        eod_mask_loss: zero the loss mask on eod tokens.
    """

    #: Progression steps.
    STEPS: tuple[int, ...] = (1, 2, 3, 5)
    #: Progressions use at most this many distinct ids (the lowest non-special ids of the vocabulary).
    MAX_ALPHABET = 256
    #: Shortest progression.
    MIN_DOC_LENGTH = 8

    def __init__(
        self,
        num_samples: int,
        seq_length: int,
        vocab_size: int,
        eod: int,
        random_seed: int = 1234,
        split_name: str = "train",
        num_distinct: int = 1_000_000,
        reserved_ids: tuple[int, ...] = (),
        reset_position_ids: bool = False,
        eod_mask_loss: bool = False,
    ) -> None:
        if seq_length < 1 or num_distinct < 1:  # dataset.seq_length, dataset.mock_num_samples: rule positive_sizes
            raise ValueError(f"seq_length={seq_length} and num_distinct={num_distinct} must be >= 1")
        if split_name not in SPLIT_NAMES:
            raise ValueError(f"split_name must be one of {SPLIT_NAMES}, not {split_name!r}")
        special = {int(eod), *(int(r) for r in reserved_ids)}
        alphabet = [i for i in range(min(vocab_size, self.MAX_ALPHABET + len(special))) if i not in special]
        alphabet = alphabet[: self.MAX_ALPHABET]
        if len(alphabet) < 2:  # the null tokenizer's vocab_size: rule mock_data_vocab
            raise DataError(f"mock data needs a tokenizer with at least 2 ordinary ids besides <eod>/<pad>, and this "
                            f"one has vocab_size={vocab_size}: use tokenizer.tokenizer_type='byte'")
        self.alphabet = np.asarray(alphabet, dtype=np.int64)
        self.num_samples = int(num_samples)
        self.seq_length = int(seq_length)
        self.vocab_size = int(vocab_size)
        self.eod = int(eod)
        self.random_seed = int(random_seed)
        self.split_name = split_name
        self.num_distinct = int(num_distinct)
        self.reset_position_ids = reset_position_ids
        self.eod_mask_loss = eod_mask_loss
        self._split_id = SPLIT_NAMES.index(split_name)

    def __len__(self) -> int:
        return self.num_samples

    def get_text(self, idx: int) -> np.ndarray:
        """The ``seq_length + 1`` tokens of sample ``idx`` (int64)."""
        if not 0 <= idx < self.num_samples:
            raise IndexError(f"sample {idx} out of range for a mock {self.split_name} split of {self.num_samples}")
        rng = np.random.default_rng([self.random_seed, self._split_id, idx % self.num_distinct])
        need = self.seq_length + 1
        m = len(self.alphabet)
        max_len = max(self.MIN_DOC_LENGTH, self.seq_length)
        min_len = min(self.MIN_DOC_LENGTH, max_len)
        out = np.empty(need, dtype=np.int64)
        filled = 0
        while filled < need:
            length = int(rng.integers(min_len, max_len + 1))
            start = int(rng.integers(m))
            step = int(self.STEPS[int(rng.integers(len(self.STEPS)))])
            doc = np.empty(length + 1, dtype=np.int64)
            doc[:-1] = self.alphabet[(start + step * np.arange(length)) % m]
            doc[-1] = self.eod
            take = min(need - filled, length + 1)
            out[filled : filled + take] = doc[:take]
            filled += take
        return out

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        return sample_from_tokens(self.get_text(int(idx)), self.eod, self.reset_position_ids, self.eod_mask_loss)
