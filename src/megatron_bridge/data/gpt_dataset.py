"""GPT pretraining samples from an indexed dataset, with megatron-core's ``GPTDataset`` semantics in numpy.

The sequences of one split are concatenated, epoch after epoch, in a seeded random order (the *document index*);
sample ``i`` is the ``seq_length + 1`` tokens starting at token ``i * seq_length`` of that stream (the *sample
index* holds where each sample starts), and the samples are visited in a seeded random order (the *shuffle
index*). With the same seed, split and sizes the three indices equal megatron-core's, so the samples are the same.
"""

import hashlib
import os
import tempfile

import numpy as np
import torch

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.data import DatasetConfig
from megatron_bridge.config.data_paths import parse_split as config_parse_split
from megatron_bridge.config.rule_set import enforce
from megatron_bridge.data.indexed import IndexedDataset
from megatron_bridge.errors import DataError
from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)

SPLIT_NAMES: tuple[str, str, str] = ("train", "valid", "test")
#: A last epoch that is needed for fewer than this fraction of its samples is shuffled on its own (as Megatron does).
SEPARATE_FINAL_EPOCH_THRESHOLD = 0.80


def parse_split(split: str) -> list[float]:
    """Normalized train/valid/test proportions of a split string such as ``"969,30,1"`` (missing parts are 0).

    Raises:
        ConfigValidationError: rule ``dataset_split``.
    """
    enforce(ConfigContainer.holding(DatasetConfig(split=split)), "dataset_split")
    return config_parse_split(split)


def split_ranges(split: str, num_elements: int) -> list[tuple[int, int] | None]:
    """``[begin, end)`` element ranges of the train, valid and test splits (None for an empty proportion).

    Same rounding as megatron-core: bookends are cumulative proportions times ``num_elements``, rounded.
    """
    props = parse_split(split)
    bounds = [0.0]
    for p in props:
        bounds.append(bounds[-1] + p)
    ranges: list[tuple[int, int] | None] = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if hi <= lo:
            ranges.append(None)
        else:
            ranges.append((int(round(lo * float(num_elements))), int(round(hi * float(num_elements)))))
    return ranges


def build_document_index(
    documents: np.ndarray, num_epochs: int, rng: np.random.RandomState, separate_final_epoch: bool
) -> np.ndarray:
    """``documents`` repeated ``num_epochs`` times and shuffled (the last epoch apart when separate_final_epoch)."""
    if not separate_final_epoch or num_epochs == 1:
        doc_index = np.tile(np.asarray(documents, dtype=np.int32), num_epochs)
        rng.shuffle(doc_index)
        return doc_index
    first = build_document_index(documents, num_epochs - 1, rng, False)
    last = build_document_index(documents, 1, rng, False)
    return np.concatenate((first, last))


def build_sample_index(
    sequence_lengths: np.ndarray, document_index: np.ndarray, seq_length: int, num_samples: int
) -> np.ndarray:
    """``[num_samples + 1, 2]`` array: (position in document_index, token offset) where each sample starts.

    Sample ``i`` covers the tokens from entry ``i`` to entry ``i + 1`` inclusive (``seq_length + 1`` tokens: the
    inputs and the shifted labels), as megatron-core's ``helpers.build_sample_idx`` computes it.
    """
    lengths = np.asarray(sequence_lengths, dtype=np.int64)[document_index]
    ends = np.cumsum(lengths)
    positions = np.arange(num_samples + 1, dtype=np.int64) * seq_length
    doc_pos = np.searchsorted(ends, positions, side="right")
    offsets = positions - (ends[doc_pos] - lengths[doc_pos])
    return np.stack([doc_pos, offsets], axis=1).astype(np.int64)


def index_build_bytes(document_entries: int, samples: int) -> int:
    """The peak memory of building a GPTDataset's indices: per document entry the int32 document index and two int64
    temporaries (lengths, their running sum); per sample the int64 positions, document positions and offsets, the
    stacked [n, 2] index and its copy, and the shuffle index."""
    return document_entries * (4 + 8 + 8) + (samples + 1) * (8 + 8 + 8 + 16 + 16 + 8)


def available_memory_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def build_shuffle_index(num_samples: int, total_size: int, rng: np.random.RandomState) -> np.ndarray:
    """A permutation of ``[0, num_samples)`` followed by one of ``[num_samples, total_size)``."""
    dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


def masks_and_position_ids(
    tokens: torch.Tensor, eod: int, reset_position_ids: bool, eod_mask_loss: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss mask (float32; 0 on input eod tokens when eod_mask_loss) and position ids (restart after every eod)."""
    n = tokens.numel()
    loss_mask = torch.ones(n, dtype=torch.float32)
    if eod_mask_loss:
        loss_mask[tokens == eod] = 0.0
    position_ids = torch.arange(n, dtype=torch.int64)
    if reset_position_ids:
        starts = torch.zeros(n, dtype=torch.int64)
        after_eod = torch.nonzero(tokens[:-1] == eod).flatten() + 1
        starts[after_eod] = after_eod
        position_ids = position_ids - torch.cummax(starts, dim=0).values
    return loss_mask, position_ids


def sample_from_tokens(
    text: np.ndarray, eod: int, reset_position_ids: bool, eod_mask_loss: bool
) -> dict[str, torch.Tensor]:
    """The training sample of ``seq_length + 1`` consecutive tokens: tokens, labels, loss_mask, position_ids."""
    t = torch.from_numpy(np.asarray(text, dtype=np.int64))
    tokens = t[:-1].contiguous()
    labels = t[1:].contiguous()
    loss_mask, position_ids = masks_and_position_ids(tokens, eod, reset_position_ids, eod_mask_loss)
    return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids}


class GPTDataset(torch.utils.data.Dataset):
    """Fixed-length samples from the sequences ``indexed_indices`` of an indexed dataset.

    Each item is a dict of tensors of length ``seq_length``: ``tokens`` and ``labels`` (int64, labels are the
    tokens shifted by one), ``loss_mask`` (float32) and ``position_ids`` (int64). There is no ``attention_mask``:
    the model applies the causal mask itself.

    Args:
        indexed: the token files.
        indexed_indices: the sequences of this split (e.g. ``np.arange(begin, end)``).
        num_samples: samples wanted (enough epochs are built to give at least this many); None for one epoch.
        seq_length: tokens per sample.
        random_seed: seed of the document and sample shuffles.
        eod: end-of-document token id.
        split_name: "train", "valid" or "test" (for logs and cache file names).
        reset_position_ids: restart position ids after every eod.
        eod_mask_loss: zero the loss mask on eod tokens.
        cache_dir: save/load the three indices there as .npy files; None builds them in memory.
    """

    def __init__(
        self,
        indexed: IndexedDataset,
        indexed_indices: np.ndarray,
        num_samples: int | None,
        *,
        seq_length: int,
        random_seed: int,
        eod: int,
        split_name: str = "train",
        reset_position_ids: bool = False,
        eod_mask_loss: bool = False,
        cache_dir: str | None = None,
    ) -> None:
        if seq_length < 1:
            raise ValueError(f"seq_length={seq_length} must be >= 1 (dataset.seq_length: rule positive_sizes)")
        self.indexed = indexed
        self.indexed_indices = np.asarray(indexed_indices, dtype=np.int32)
        self.num_samples = num_samples
        self.seq_length = int(seq_length)
        self.random_seed = int(random_seed)
        self.eod = int(eod)
        self.split_name = split_name
        self.reset_position_ids = reset_position_ids
        self.eod_mask_loss = eod_mask_loss
        self.cache_dir = cache_dir
        self.tokens_per_epoch = int(indexed.sequence_lengths[self.indexed_indices].sum(dtype=np.int64))
        if self.tokens_per_epoch <= self.seq_length:
            raise DataError(
                f"the {split_name} split of {indexed.path_prefix!r} has {len(self.indexed_indices)} sequences with "
                f"{self.tokens_per_epoch} tokens, too few for one sample of seq_length {self.seq_length} + 1 tokens; "
                "use more data, a shorter dataset.seq_length, or give this split a larger share in dataset.split."
            )
        self.document_index, self.sample_index, self.shuffle_index = self._load_or_build_indices()

    def _num_epochs(self) -> int:
        if self.num_samples is None:
            return 1
        needed = self.num_samples * self.seq_length + 1
        return max(1, -(-needed // self.tokens_per_epoch))

    def _build_indices(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        num_epochs = self._num_epochs()
        per_epoch = self.tokens_per_epoch
        separate_final_epoch = False
        sans_final = 0
        if num_epochs > 1 and self.num_samples is not None:
            sans_final = ((num_epochs - 1) * per_epoch - 1) // self.seq_length
            from_final = self.num_samples - sans_final
            per_epoch_samples = (per_epoch - 1) // self.seq_length
            separate_final_epoch = from_final < int(SEPARATE_FINAL_EPOCH_THRESHOLD * per_epoch_samples)
        total = (num_epochs * per_epoch - 1) // self.seq_length
        self._check_index_memory(num_epochs * len(self.indexed_indices), total)
        rng = np.random.RandomState(self.random_seed)
        document_index = build_document_index(self.indexed_indices, num_epochs, rng, separate_final_epoch)
        sample_index = build_sample_index(self.indexed.sequence_lengths, document_index, self.seq_length, total)
        first = sans_final if separate_final_epoch else total
        shuffle_index = build_shuffle_index(first, total, rng)
        logger.debug(
            "%s split of %s: %d samples over %d epochs", self.split_name, self.indexed.path_prefix, total, num_epochs
        )
        return document_index, sample_index, shuffle_index

    def _check_index_memory(self, document_entries: int, samples: int) -> None:
        """DataError, before anything is allocated, when building the indices would need more memory than this
        machine has available (:func:`index_build_bytes`)."""
        need, available = index_build_bytes(document_entries, samples), available_memory_bytes()
        if available is None or need <= available:
            return
        gib = 1024 ** 3
        raise DataError(
            f"the {self.split_name} split of {self.indexed.path_prefix!r} is asked for {self.num_samples} samples "
            f"({samples} samples over {document_entries} document entries, {self._num_epochs()} epochs): building its "
            f"indices needs about {need / gib:.1f} GiB, more than the {available / gib:.1f} GiB of memory available. "
            "Fix: lower train.train_iters (or train.train_samples, train.global_batch_size; for the valid split "
            "validation.eval_iters), or use more data per epoch")

    def _description(self) -> str:
        idx = self.indexed_indices
        span = f"{idx[0]}-{idx[-1]}:{len(idx)}" if len(idx) else "empty"
        return (
            f"GPTDataset v1|{os.path.abspath(self.indexed.path_prefix)}|{len(self.indexed)}|{self.indexed.num_tokens}|"
            f"{span}|{self.num_samples}|{self.seq_length}|{self.random_seed}|{self.split_name}"
        )

    def _load_or_build_indices(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.cache_dir is None:
            return self._build_indices()
        digest = hashlib.md5(self._description().encode("utf-8")).hexdigest()
        names = ("document_index", "sample_index", "shuffle_index")
        paths = [os.path.join(self.cache_dir, f"{digest}-GPTDataset-{self.split_name}-{n}.npy") for n in names]
        if all(os.path.isfile(p) for p in paths):
            try:
                loaded = tuple(np.load(p, mmap_mode="r", allow_pickle=False) for p in paths)
                logger.debug("loaded %s indices from %s", self.split_name, self.cache_dir)
                return loaded  # type: ignore[return-value]
            except (OSError, ValueError) as e:
                logger.warning(
                    "rebuilding the %s indices: cannot read the cache in %s (%s)", self.split_name, self.cache_dir, e
                )
        arrays = self._build_indices()
        os.makedirs(self.cache_dir, exist_ok=True)
        for path, arr in zip(paths, arrays):
            # Write-then-rename, so ranks that build the same (identical) files concurrently never read a partial one.
            fd, tmp = tempfile.mkstemp(dir=self.cache_dir, suffix=".npy.tmp")
            with os.fdopen(fd, "wb") as f:
                np.save(f, arr, allow_pickle=False)
            os.replace(tmp, path)
        return arrays

    def __len__(self) -> int:
        return int(self.sample_index.shape[0]) - 1

    def get_text(self, idx: int) -> np.ndarray:
        """The ``seq_length + 1`` tokens of sample ``idx`` (after the shuffle), as int64."""
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} out of range for the {self.split_name} split of {len(self)} samples")
        j = int(self.shuffle_index[idx])
        doc_beg, off_beg = (int(v) for v in self.sample_index[j])
        doc_end, off_end = (int(v) for v in self.sample_index[j + 1])
        if doc_beg == doc_end:
            parts = [self.indexed.get(int(self.document_index[doc_beg]), off_beg, off_end - off_beg + 1)]
        else:
            parts = []
            for i in range(doc_beg, doc_end + 1):
                offset = off_beg if i == doc_beg else 0
                length = off_end + 1 if i == doc_end else None
                parts.append(self.indexed.get(int(self.document_index[i]), offset, length))
        return np.concatenate(parts).astype(np.int64, copy=False)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        return sample_from_tokens(self.get_text(int(idx)), self.eod, self.reset_position_ids, self.eod_mask_loss)
