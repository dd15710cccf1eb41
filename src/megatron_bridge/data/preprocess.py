"""JSONL text → Megatron indexed dataset (``<prefix>_<key>_document.bin/.idx``), like Megatron's preprocess_data.py."""

import json
import multiprocessing
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from megatron_bridge.config.data import TokenizerConfig
from megatron_bridge.data.indexed import IndexedDatasetBuilder, bin_path_of, idx_path_of, optimal_dtype
from megatron_bridge.data.tokenizers import Tokenizer, build_tokenizer
from megatron_bridge.errors import ConfigValidationError, DataError
from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)

_WORKER_TOKENIZER: Tokenizer | None = None


@dataclass
class PreprocessSummary:
    """What :func:`preprocess_jsonl` wrote."""

    documents: int
    """JSON lines turned into documents (blank lines are skipped)."""
    tokens: int
    """Tokens written, summed over all json keys."""
    seconds: float
    """Wall-clock time."""
    output_prefixes: dict[str, str] = field(default_factory=dict)
    """Indexed dataset prefix written for every json key, e.g. {"text": "out/x_text_document"}."""


def output_prefix_for(output_prefix: str, key: str) -> str:
    """The indexed dataset prefix Megatron's tool writes for a json key: ``<output_prefix>_<key>_document``."""
    return f"{output_prefix}_{key}_document"


def _encode_line(
    tokenizer: Tokenizer, source: str, lineno: int, line: str, json_keys: Sequence[str], append_eod: bool
) -> dict[str, list[int]] | None:
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{source}:{lineno}: not a JSON object ({e.msg})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{source}:{lineno}: expected a JSON object, got {type(obj).__name__}")
    out: dict[str, list[int]] = {}
    for key in json_keys:
        if key not in obj:
            raise DataError(f"{source}:{lineno}: no key {key!r} (keys: {sorted(obj)}); pass --json-keys")
        text = obj[key]
        if not isinstance(text, str):
            raise DataError(f"{source}:{lineno}: {key!r} is a {type(text).__name__}, not a string")
        ids = tokenizer.tokenize(text)
        if ids and append_eod:
            ids.append(tokenizer.eod)
        out[key] = ids
    return out


def _init_worker(tokenizer_cfg: TokenizerConfig) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = build_tokenizer(tokenizer_cfg)


def _worker_encode(args: tuple[str, int, str, tuple[str, ...], bool]) -> dict[str, list[int]] | None:
    source, lineno, line, keys, append_eod = args
    assert _WORKER_TOKENIZER is not None  # set by _init_worker (internal invariant, not user input)
    return _encode_line(_WORKER_TOKENIZER, source, lineno, line, keys, append_eod)


def _read_lines(path: str) -> Iterator[tuple[int, str]]:
    with open(path, encoding="utf-8") as f:
        yield from enumerate(f, start=1)


def preprocess_jsonl(
    input_path: str,
    output_prefix: str,
    tokenizer_cfg: TokenizerConfig,
    *,
    json_keys: Sequence[str] = ("text",),
    append_eod: bool = False,
    workers: int = 1,
) -> PreprocessSummary:
    """Tokenize every line of a JSONL file (one document per line) into one indexed dataset per json key.

    Args:
        input_path: a file with one JSON object per line.
        output_prefix: writes ``<output_prefix>_<key>_document.bin/.idx`` (folders are created).
        tokenizer_cfg: the tokenizer ("byte" or "huggingface"; "null" cannot tokenize).
        json_keys: the keys whose strings are tokenized.
        append_eod: append the eod token to every non-empty document (needed so that GPT samples, which span
            documents, see where a document ends).
        workers: tokenizer processes (1 tokenizes in this process); the output order is the input order.

    Raises:
        DataError: a missing input file, or a line that is not a JSON object with string values at json_keys.
    """
    if not Path(input_path).is_file():
        raise DataError(f"input file {input_path!r} does not exist")
    if workers < 1:
        raise ConfigValidationError(f"workers={workers} must be >= 1")
    keys = tuple(json_keys)
    if not keys:
        raise ConfigValidationError("json_keys must name at least one key")
    start = time.perf_counter()
    tokenizer = build_tokenizer(tokenizer_cfg)
    dtype = optimal_dtype(tokenizer.vocab_size)
    prefixes = {k: output_prefix_for(output_prefix, k) for k in keys}
    builders = {k: IndexedDatasetBuilder(bin_path_of(p), dtype) for k, p in prefixes.items()}
    docs = 0
    tokens = 0
    jobs = ((input_path, n, line, keys, append_eod) for n, line in _read_lines(input_path))
    pool = None
    try:
        if workers == 1:
            encoded: Iterator[dict[str, list[int]] | None] = (
                _encode_line(tokenizer, input_path, n, line, keys, append_eod) for _, n, line, _, _ in jobs
            )
        else:
            pool = multiprocessing.Pool(workers, initializer=_init_worker, initargs=(tokenizer_cfg,))
            encoded = pool.imap(_worker_encode, jobs, chunksize=32)
        for doc in encoded:
            if doc is None:
                continue
            docs += 1
            for k, ids in doc.items():
                builders[k].add_document(ids)
                tokens += len(ids)
    except BaseException:
        for b in builders.values():
            b.abort()
        raise
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    for k, p in prefixes.items():
        builders[k].finalize(idx_path_of(p))
    seconds = time.perf_counter() - start
    logger.info("preprocessed %s: %d documents, %d tokens in %.2f s", input_path, docs, tokens, seconds)
    return PreprocessSummary(documents=docs, tokens=tokens, seconds=seconds, output_prefixes=prefixes)
