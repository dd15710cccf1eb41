"""JSONL text → Megatron indexed dataset (``<prefix>_<key>_document.bin/.idx``), like Megatron's preprocess_data.py."""

import json
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from megatron_bridge.config.data import TokenizerConfig
from megatron_bridge.data.indexed import IndexedDatasetBuilder, bin_path_of, idx_path_of, optimal_dtype
from megatron_bridge.data.tokenizers import Tokenizer, build_tokenizer
from megatron_bridge.errors import ConfigValidationError, DataError, PathError
from megatron_bridge.utils.atomic import owned_temporary_sibling, remove_path, remove_stale_temporaries
from megatron_bridge.utils.logging import get_logger
from megatron_bridge.utils.paths import describe_path, output_path_problem


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
        try:
            ids = tokenizer.tokenize(text)
        except UnicodeEncodeError as e:
            raise DataError(f"{source}:{lineno}: {key!r} holds text that cannot be encoded as UTF-8 ({e.reason}: "
                            f"{e.object[e.start:e.end]!r} at character {e.start}, e.g. a lone surrogate escape such "
                            "as \\ud800); fix or drop that line") from None
        if ids and append_eod:
            ids.append(tokenizer.eod)
        out[key] = ids
    return out


def _init_worker(tokenizer_cfg: TokenizerConfig) -> None:
    global _WORKER_TOKENIZER
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # Pool.terminate() ends workers; a script's handler is the parent's
    _WORKER_TOKENIZER = build_tokenizer(tokenizer_cfg)


def _worker_encode(args: tuple[str, int, str, tuple[str, ...], bool]) -> dict[str, list[int]] | None:
    source, lineno, line, keys, append_eod = args
    assert _WORKER_TOKENIZER is not None  # set by _init_worker (internal invariant, not user input)
    return _encode_line(_WORKER_TOKENIZER, source, lineno, line, keys, append_eod)


def _read_lines(path: str) -> Iterator[tuple[int, str]]:
    try:
        f = open(path, "rb")  # noqa: SIM115  (closed by the with below)
    except OSError as exc:
        raise DataError(f"input file {path!r} cannot be read: {_os_reason(exc)}") from None
    with f:
        for lineno, raw in enumerate(f, start=1):
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid UTF-8 ({e.reason} at byte {e.start} of the line: "
                                f"{raw[max(0, e.start - 8):e.start + 8]!r}); convert the file to UTF-8") from None


def _os_reason(exc: OSError) -> str:
    where = f" ({exc.filename!r})" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


def _check_input(input_path: str) -> None:
    """DataError unless ``input_path`` is a readable regular file, naming what it is instead."""
    if Path(input_path).is_file() and os.access(input_path, os.R_OK):
        return
    what = describe_path(input_path)
    if what == "missing":
        raise DataError(f"input file {input_path!r} does not exist")
    raise DataError(f"input file {input_path!r} cannot be read: it is {what}; give a readable JSONL file")


def _check_output_folder(output_prefix: str) -> None:
    """PathError when the folder of ``output_prefix`` cannot be created or written (before any work)."""
    folder = Path(output_prefix).parent
    problem = output_path_problem(folder, folder=True)
    if problem:
        raise PathError(f"output prefix {output_prefix!r} cannot be written: its folder {str(folder)!r}: {problem}; "
                        "choose another --output-prefix")


def _check_outputs(prefixes: dict[str, str], overwrite: bool) -> None:
    existing = [p for prefix in prefixes.values() for p in (bin_path_of(prefix), idx_path_of(prefix))
                if Path(p).exists()]
    if existing and not overwrite:
        raise DataError(f"output {existing[0]!r} already exists: pass --overwrite (overwrite=True) to replace the "
                        "dataset, or choose another --output-prefix")


def _publish(prefixes: dict[str, str], tmp: dict[str, tuple[str, str]]) -> None:
    """Rename every complete temporary ``.bin``/``.idx`` pair into place (the ``.idx`` last)."""
    for key, prefix in prefixes.items():
        tmp_bin, tmp_idx = tmp[key]
        os.replace(tmp_bin, bin_path_of(prefix))
        os.replace(tmp_idx, idx_path_of(prefix))


def preprocess_jsonl(
    input_path: str,
    output_prefix: str,
    tokenizer_cfg: TokenizerConfig,
    *,
    json_keys: Sequence[str] = ("text",),
    append_eod: bool = False,
    workers: int = 1,
    overwrite: bool = False,
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
        overwrite: replace existing output files (otherwise they are a DataError, before any work).

    Outputs are written to temporary files (``.<name>.tmp-<pid>-<id>``) and renamed into place only once every
    ``.bin``/``.idx`` pair is complete: an error, Ctrl-C or SIGTERM removes them, and a SIGKILL leaves an existing
    dataset as it was; the next run to the same prefix removes temporaries whose process is gone.

    Raises:
        DataError: a missing or empty input file, an existing output without ``overwrite``, a line that is not
            valid UTF-8, not a JSON object with string values at json_keys, or text that cannot be encoded (file and
            line number named).
    """
    _check_input(input_path)
    if workers < 1:
        raise ConfigValidationError(f"workers={workers} must be >= 1")
    keys = tuple(json_keys)
    if not keys:
        raise ConfigValidationError("json_keys must name at least one key")
    start = time.perf_counter()
    tokenizer = build_tokenizer(tokenizer_cfg)
    dtype = optimal_dtype(tokenizer.vocab_size)
    prefixes = {k: output_prefix_for(output_prefix, k) for k in keys}
    _check_output_folder(output_prefix)
    _check_outputs(prefixes, overwrite)
    for p in prefixes.values():
        for stale in (*remove_stale_temporaries(bin_path_of(p)), *remove_stale_temporaries(idx_path_of(p))):
            logger.warning("removed %s, left by a preprocessing run that was killed", stale)
    tmp = {k: (str(owned_temporary_sibling(bin_path_of(p))), str(owned_temporary_sibling(idx_path_of(p))))
           for k, p in prefixes.items()}
    builders: dict[str, IndexedDatasetBuilder] = {}
    docs = 0
    tokens = 0
    jobs = ((input_path, n, line, keys, append_eod) for n, line in _read_lines(input_path))
    pool = None
    try:  # from the first temporary file on: a SIGTERM right after it is created still removes it
        for k in prefixes:
            builders[k] = IndexedDatasetBuilder(tmp[k][0], dtype)
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
        if docs == 0:
            raise DataError(f"input file {input_path!r} holds no documents (it is empty or has only blank lines): "
                            "nothing written; give a JSONL file with one JSON object per line")
        for k in prefixes:
            builders[k].finalize(tmp[k][1])
        _publish(prefixes, tmp)
    except BaseException as exc:
        for b in builders.values():
            b.abort()
        for paths in tmp.values():  # also a .bin opened by a builder interrupted before it was recorded
            for path in paths:
                remove_path(path)
        if isinstance(exc, OSError) and not isinstance(exc, DataError):
            raise DataError(f"preprocessing {input_path!r} into {output_prefix!r} failed: {_os_reason(exc)}; "
                            "nothing written") from exc
        raise
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    seconds = time.perf_counter() - start
    logger.info("preprocessed %s: %d documents, %d tokens in %.2f s", input_path, docs, tokens, seconds)
    return PreprocessSummary(documents=docs, tokens=tokens, seconds=seconds, output_prefixes=prefixes)
