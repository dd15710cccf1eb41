"""The small text corpus shipped in ``data/corpus/``, tokenized on demand into a cache folder."""

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from megatron_bridge.config.data import TokenizerConfig
from megatron_bridge.data.indexed import IndexedDataset, bin_path_of, idx_path_of, indexed_dataset_exists
from megatron_bridge.data.preprocess import output_prefix_for, preprocess_jsonl
from megatron_bridge.errors import ConfigValidationError, DataError, PathError
from megatron_bridge.utils.logging import get_logger
from megatron_bridge.utils.paths import file_problem, output_path_problem


logger = get_logger(__name__)

#: Environment variable that overrides where the corpus JSONL is read from.
CORPUS_ENV_VAR = "MEGATRON_BRIDGE_CORPUS"
CORPUS_FILENAME = "tiny_encyclopedia.jsonl"


def default_corpus_path() -> Path:
    """``$MEGATRON_BRIDGE_CORPUS`` if set, else ``data/corpus/tiny_encyclopedia.jsonl`` of the source checkout."""
    env = os.environ.get(CORPUS_ENV_VAR)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "data" / "corpus" / CORPUS_FILENAME


def _tokenizer_tag(cfg: TokenizerConfig) -> str:
    if cfg.tokenizer_type == "byte":
        if not cfg.extra_special_tokens:
            return "byte"
        return "byte-" + hashlib.sha256("\0".join(cfg.extra_special_tokens).encode()).hexdigest()[:8]
    if cfg.tokenizer_type == "huggingface":
        if not cfg.tokenizer_file or not os.path.isfile(cfg.tokenizer_file):
            raise DataError(f"tokenizer.tokenizer_file={cfg.tokenizer_file!r} does not exist")
        h = hashlib.sha256(Path(cfg.tokenizer_file).read_bytes())
        h.update(str(cfg.eod_token).encode())
        return "hf-" + h.hexdigest()[:8]
    raise ConfigValidationError(
        f"the corpus cannot be tokenized with tokenizer.tokenizer_type={cfg.tokenizer_type!r}; use 'byte' or "
        "'huggingface'.",
        ("tokenizer.tokenizer_type",),
    )


def ensure_corpus_indexed(
    output_dir: str, tokenizer_cfg: TokenizerConfig | None = None, corpus_path: str | None = None
) -> str:
    """Tokenize the shipped corpus into ``output_dir`` unless already there; return the indexed dataset prefix.

    The prefix (for ``dataset.data_path``) names the corpus content and the tokenizer, so an edited corpus or
    another tokenizer gets new files. Every document ends with the eod token. Safe to call from several ranks at
    once: each writes to a private temporary folder and renames complete files into place.

    Args:
        output_dir: cache folder (created).
        tokenizer_cfg: defaults to the byte tokenizer.
        corpus_path: a JSONL file with a "text" field per line; defaults to :func:`default_corpus_path`.
    """
    tokenizer_cfg = tokenizer_cfg or TokenizerConfig(tokenizer_type="byte")
    source = Path(corpus_path) if corpus_path else default_corpus_path()
    if file_problem(source):
        raise DataError(
            f"corpus file {str(source)!r} {file_problem(source)}; run from a source checkout of megatron-bridge or set "
            f"${CORPUS_ENV_VAR} to the path of data/corpus/{CORPUS_FILENAME}"
        )
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:10]
    name = f"{source.stem}-{digest}-{_tokenizer_tag(tokenizer_cfg)}"
    out = Path(output_dir)
    problem = output_path_problem(out, folder=True)
    if problem and not indexed_dataset_exists(output_prefix_for(str(out / name), "text")):
        raise PathError(f"corpus cache folder {output_dir!r} cannot be written: {problem}; choose another folder "
                        "(--data-cache)")
    prefix = output_prefix_for(str(out / name), "text")
    if indexed_dataset_exists(prefix):
        try:
            IndexedDataset(prefix)
            return prefix
        except DataError as e:
            logger.warning("re-tokenizing the corpus: %s", e)
    out.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=out, prefix=".tmp-corpus-")
    try:
        summary = preprocess_jsonl(str(source), os.path.join(tmp, name), tokenizer_cfg, append_eod=True)
        tmp_prefix = summary.output_prefixes["text"]
        # .bin first, .idx last: the pair is only considered present once the .idx exists.
        os.replace(bin_path_of(tmp_prefix), bin_path_of(prefix))
        os.replace(idx_path_of(tmp_prefix), idx_path_of(prefix))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info(
        "tokenized corpus %s into %s (%d documents, %d tokens)", source, prefix, summary.documents, summary.tokens
    )
    return prefix
