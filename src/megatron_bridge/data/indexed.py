"""Megatron's indexed dataset format: a ``.bin`` file of raw token arrays and a ``.idx`` file that indexes it.

The byte layout is the one megatron-core's ``megatron/core/datasets/indexed_dataset.py`` writes and reads
(little-endian throughout)::

    .idx   9 bytes   magic b"MMIDIDX\\x00\\x00"
           8 bytes   version, <Q, always 1
           1 byte    dtype code, <B (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)
           8 bytes   sequence count N, <Q
           8 bytes   document-index count D + 1, <Q (the number of int64 entries that follow the pointers)
           N int32   sequence lengths (tokens)
           N int64   sequence byte offsets into .bin
           D+1 int64 document indices: sequence index where each document starts, first 0, last N
    .bin           the N sequences' tokens, back to back, in the dtype above

A document is one or more consecutive sequences (``preprocess_data.py`` writes one sequence per document).
"""

import os
import struct
from pathlib import Path

import numpy as np

from megatron_bridge.errors import DataError
from megatron_bridge.utils.paths import describe_path


INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
#: Byte size of the .idx header (magic, version, dtype code, sequence count, document-index count).
HEADER_SIZE = len(INDEX_MAGIC) + 8 + 1 + 8 + 8

#: Megatron's ``DType`` codes.
DTYPE_CODES: dict[int, type[np.generic]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
_CODE_OF_DTYPE = {np.dtype(t): c for c, t in DTYPE_CODES.items()}


def dtype_code(dtype: np.dtype | type) -> int:
    """Megatron's code of a numpy dtype (raises DataError for dtypes the format cannot store)."""
    dt = np.dtype(dtype)
    if dt not in _CODE_OF_DTYPE:
        known = sorted(map(str, _CODE_OF_DTYPE))
        raise DataError(f"dtype {dt} cannot be stored in an indexed dataset; use one of {known}")
    return _CODE_OF_DTYPE[dt]


def optimal_dtype(vocab_size: int | None) -> type[np.generic]:
    """Token dtype for a vocabulary, as Megatron chooses it: uint16 below 65500 ids, else int32."""
    if vocab_size is not None and vocab_size < 65500:
        return np.uint16
    return np.int32


def idx_path_of(path_prefix: str) -> str:
    """``<prefix>.idx``."""
    return path_prefix + ".idx"


def bin_path_of(path_prefix: str) -> str:
    """``<prefix>.bin``."""
    return path_prefix + ".bin"


def indexed_dataset_exists(path_prefix: str) -> bool:
    """True when both ``<prefix>.bin`` and ``<prefix>.idx`` exist."""
    return os.path.isfile(idx_path_of(path_prefix)) and os.path.isfile(bin_path_of(path_prefix))


def encode_index(dtype: np.dtype | type, sequence_lengths: np.ndarray, document_indices: np.ndarray) -> bytes:
    """The bytes of an ``.idx`` file for sequences of the given lengths (pointers are computed)."""
    lengths = np.asarray(sequence_lengths, dtype=np.int32)
    doc_idx = np.asarray(document_indices, dtype=np.int64)
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * itemsize, out=pointers[1:])
    header = (
        INDEX_MAGIC
        + struct.pack("<Q", INDEX_VERSION)
        + struct.pack("<B", dtype_code(dtype))
        + struct.pack("<Q", len(lengths))
        + struct.pack("<Q", len(doc_idx))
    )
    return header + lengths.tobytes(order="C") + pointers.tobytes(order="C") + doc_idx.tobytes(order="C")


class IndexedDatasetBuilder:
    """Writes a ``.bin`` file document by document, then its ``.idx`` file on :meth:`finalize`.

    Example::

        builder = IndexedDatasetBuilder("out/x_text_document.bin", optimal_dtype(tokenizer.vocab_size))
        for doc in docs:
            builder.add_document(tokenizer.tokenize(doc) + [tokenizer.eod])
        builder.finalize("out/x_text_document.idx")
    """

    def __init__(self, bin_path: str, dtype: np.dtype | type = np.int32) -> None:
        self.dtype = np.dtype(dtype)
        dtype_code(self.dtype)  # validate early
        self.bin_path = bin_path
        Path(bin_path).parent.mkdir(parents=True, exist_ok=True)
        self._file = open(bin_path, "wb")  # closed in finalize()
        self._lengths: list[int] = []
        self._document_indices: list[int] = [0]
        self._num_tokens = 0
        if np.issubdtype(self.dtype, np.integer):
            info = np.iinfo(self.dtype)
            self._bounds: tuple[int, int] | None = (int(info.min), int(info.max))
        else:
            self._bounds = None

    def add_document(self, tokens: "list[int] | np.ndarray", lengths: list[int] | None = None) -> None:
        """Append one document.

        Args:
            tokens: the document's token ids; an empty document adds no sequence (as in Megatron).
            lengths: split the document into several sequences of these lengths (default: one sequence).
        """
        arr = np.asarray(tokens)
        if arr.ndim != 1:
            raise DataError(f"add_document expects a 1-D token list, got shape {arr.shape}")
        if arr.size and self._bounds is not None:
            lo, hi = int(arr.min()), int(arr.max())
            if lo < self._bounds[0] or hi > self._bounds[1]:
                raise DataError(
                    f"token ids [{lo}, {hi}] do not fit the dtype {self.dtype} of {self.bin_path!r}; "
                    "write with a wider dtype (int32)."
                )
        arr = arr.astype(self.dtype, copy=False)
        if lengths is None:
            lengths = [int(arr.size)] if arr.size else []
        if sum(lengths) != arr.size or any(n < 0 for n in lengths):
            raise DataError(f"sequence lengths {lengths} do not add up to the document's {arr.size} tokens")
        self._file.write(arr.tobytes(order="C"))
        self._lengths.extend(int(n) for n in lengths)
        self._document_indices.append(len(self._lengths))
        self._num_tokens += int(arr.size)

    @property
    def num_documents(self) -> int:
        """Documents added so far."""
        return len(self._document_indices) - 1

    @property
    def num_tokens(self) -> int:
        """Tokens added so far."""
        return self._num_tokens

    def abort(self) -> None:
        """Close and delete the partly written ``.bin`` file (after an error)."""
        self._file.close()
        Path(self.bin_path).unlink(missing_ok=True)

    def finalize(self, idx_path: str) -> None:
        """Close the ``.bin`` file and write the ``.idx`` file."""
        self._file.close()
        data = encode_index(self.dtype, np.asarray(self._lengths), np.asarray(self._document_indices))
        with open(idx_path, "wb") as f:
            f.write(data)


class IndexedDataset:
    """Read-only, memory-mapped view of ``<path_prefix>.bin`` / ``<path_prefix>.idx``.

    ``dataset[i]`` is sequence ``i`` as a numpy array (a view of the mapped file; copy it to keep it), ``len`` is the
    number of sequences. Raises DataError naming the file when a file is missing, truncated or corrupt.
    """

    def __init__(self, path_prefix: str) -> None:
        self.path_prefix = str(path_prefix)
        self._open()

    def _open(self) -> None:
        idx_path, bin_path = idx_path_of(self.path_prefix), bin_path_of(self.path_prefix)
        for p in (idx_path, bin_path):
            if not os.path.isfile(p):
                what = describe_path(p)
                if what == "missing":
                    raise DataError(f"indexed dataset file {p!r} does not exist")
                raise DataError(f"indexed dataset file {p!r} cannot be read: it is {what}, not a regular file")
        try:
            self._open_files(idx_path, bin_path)
        except OSError as exc:
            where = exc.filename if exc.filename else f"{idx_path} / {bin_path}"
            raise DataError(f"indexed dataset file {where!r} cannot be read: {exc.strerror or exc}; check its "
                            "permissions (it must be readable by the user running the job)") from None

    def _open_files(self, idx_path: str, bin_path: str) -> None:
        idx_size = os.path.getsize(idx_path)
        with open(idx_path, "rb") as f:
            header = f.read(HEADER_SIZE)
        if len(header) < HEADER_SIZE:
            raise DataError(f"{idx_path!r} is truncated: {idx_size} bytes, shorter than the {HEADER_SIZE}-byte header")
        if header[:9] != INDEX_MAGIC:
            raise DataError(f"{idx_path!r} is not a Megatron .idx file (bad magic {header[:9]!r})")
        version, code, n_seq, n_doc = struct.unpack("<QBQQ", header[9:])
        if version != INDEX_VERSION:
            raise DataError(f"{idx_path!r} has index version {version}; only version {INDEX_VERSION} is supported")
        if code not in DTYPE_CODES:
            raise DataError(f"{idx_path!r} has an unknown dtype code {code}")
        self.dtype = np.dtype(DTYPE_CODES[code])
        expected = HEADER_SIZE + 4 * n_seq + 8 * n_seq + 8 * n_doc
        if idx_size != expected:
            raise DataError(
                f"{idx_path!r} is truncated or corrupt: {idx_size} bytes, expected {expected} for "
                f"{n_seq} sequences and {n_doc} document indices"
            )
        idx_map = np.memmap(idx_path, dtype=np.uint8, mode="r")
        off = HEADER_SIZE
        self._sequence_lengths = np.frombuffer(idx_map, dtype=np.int32, count=n_seq, offset=off)
        off += 4 * n_seq
        self._sequence_pointers = np.frombuffer(idx_map, dtype=np.int64, count=n_seq, offset=off)
        off += 8 * n_seq
        self._document_indices = np.frombuffer(idx_map, dtype=np.int64, count=n_doc, offset=off)
        self._check_index(idx_path, n_seq)

        bin_size = os.path.getsize(bin_path)
        total = int(self._sequence_lengths.sum(dtype=np.int64)) * self.dtype.itemsize
        if bin_size != total:
            raise DataError(
                f"{bin_path!r} is truncated or corrupt: {bin_size} bytes, but {idx_path!r} describes {total} bytes"
            )
        if bin_size:
            self._bin = np.memmap(bin_path, dtype=self.dtype, mode="r")
        else:
            self._bin = np.zeros(0, dtype=self.dtype)

    def _check_index(self, idx_path: str, n_seq: int) -> None:
        lengths, pointers, docs = self._sequence_lengths, self._sequence_pointers, self._document_indices
        if len(docs) == 0 or docs[0] != 0 or docs[-1] != n_seq or np.any(np.diff(docs) < 0):
            raise DataError(f"{idx_path!r} is corrupt: document indices must rise from 0 to the sequence count {n_seq}")
        if n_seq and np.any(lengths < 0):
            raise DataError(f"{idx_path!r} is corrupt: negative sequence lengths")
        if n_seq:
            expected = np.zeros(n_seq, dtype=np.int64)
            np.cumsum(lengths[:-1].astype(np.int64) * self.dtype.itemsize, out=expected[1:])
            if not np.array_equal(expected, pointers):
                raise DataError(f"{idx_path!r} is corrupt: sequence pointers do not match the sequence lengths")

    def __getstate__(self) -> dict[str, str]:
        # Memory maps are reopened in the receiving process (DataLoader workers started with "spawn").
        return {"path_prefix": self.path_prefix}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.path_prefix = state["path_prefix"]
        self._open()

    def __len__(self) -> int:
        return len(self._sequence_lengths)

    def __getitem__(self, idx: int | np.integer | slice) -> "np.ndarray | list[np.ndarray]":
        """Sequence ``idx`` (a view), or a list of sequences for a contiguous slice."""
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise ValueError("slices of an IndexedDataset must be contiguous (step 1)")
            return [self.get(i) for i in range(start, stop)]
        if not isinstance(idx, int | np.integer):
            raise TypeError(f"IndexedDataset index must be an int or a slice, not {type(idx).__name__}")
        return self.get(int(idx))

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``[offset, offset + length)`` of sequence ``idx`` (to its end when length is None)."""
        n = len(self)
        if idx < 0:
            idx += n
        if not 0 <= idx < n:
            raise IndexError(f"sequence index {idx} out of range for {n} sequences in {self.path_prefix!r}")
        seq_len = int(self._sequence_lengths[idx])
        if length is None:
            length = seq_len - offset
        if offset < 0 or length < 0 or offset + length > seq_len:
            raise IndexError(f"tokens [{offset}, {offset + length}) out of range of sequence {idx} ({seq_len} tokens)")
        start = int(self._sequence_pointers[idx]) // self.dtype.itemsize + offset
        return self._bin[start : start + length]

    @property
    def sequence_lengths(self) -> np.ndarray:
        """int32 array: tokens per sequence."""
        return self._sequence_lengths

    @property
    def sequence_pointers(self) -> np.ndarray:
        """int64 array: byte offset of every sequence in the ``.bin`` file."""
        return self._sequence_pointers

    @property
    def document_indices(self) -> np.ndarray:
        """int64 array of length documents + 1: the first sequence of every document, then the sequence count."""
        return self._document_indices

    @property
    def num_documents(self) -> int:
        """Number of documents."""
        return len(self._document_indices) - 1

    @property
    def tokens(self) -> np.ndarray:
        """All tokens of the ``.bin`` file as one flat, memory-mapped array."""
        return self._bin

    @property
    def num_tokens(self) -> int:
        """Total tokens in the ``.bin`` file."""
        return int(self._sequence_lengths.sum(dtype=np.int64))
