"""Validation rules of the data sources, the tokenizer and the profiler settings (``cfg.dataset``,
``cfg.tokenizer``, ``cfg.profiling``).

The data loaders and the tokenizer builder enforce these same rules (:func:`~megatron_bridge.config.rules.enforce`)
and read the fields with the parsers of :mod:`megatron_bridge.config.data_paths`, so a value is checked in one place.
What only the files can tell (a missing prefix, a tokenizer.json without a BOS token) is checked where they are read.
"""

from typing import TYPE_CHECKING

from megatron_bridge.config.data_paths import data_path_problems, split_problem
from megatron_bridge.config.gpus import find_gpu, known_gpus
from megatron_bridge.config.rule_registry import fail, rule


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

DATASET_RULES = ("dataset_source", "dataset_split", "dataset_data_path", "positive_sizes", "nonnegative_values")
"""The rules the data loaders enforce on a ``DatasetConfig`` (its sizes are in positive_sizes and
nonnegative_values)."""
TOKENIZER_RULES = ("field_types", "tokenizer_file", "tokenizer_settings")
"""The rules ``build_tokenizer`` enforces on a ``TokenizerConfig``."""
RESERVED_TOKENS = ("<eod>", "<pad>")
"""Special tokens the byte tokenizer always has (data/tokenizers.py)."""


@rule("dataset_source", ("dataset.mock", "dataset.data_path"),
      "Exactly one data source: dataset.mock=True, or dataset.mock=False with dataset.data_path.")
def _dataset_source(cfg: "ConfigContainer", world_size: int) -> None:
    d = cfg.dataset
    if d.mock and d.data_path:
        fail("dataset.mock=True and dataset.data_path are both set: set dataset.mock=False to train on data_path",
             "dataset.mock", "dataset.data_path")
    if not d.mock and not d.data_path:
        fail("dataset.mock=False needs dataset.data_path (indexed .bin/.idx prefixes)", "dataset.data_path")


@rule("tokenizer_file", ("tokenizer.tokenizer_type", "tokenizer.tokenizer_file", "tokenizer.vocab_size"),
      "tokenizer_type 'huggingface' needs tokenizer.tokenizer_file; 'null' needs tokenizer.vocab_size.")
def _tokenizer(cfg: "ConfigContainer", world_size: int) -> None:
    t = cfg.tokenizer
    if t.tokenizer_type == "huggingface" and not t.tokenizer_file:
        fail("tokenizer.tokenizer_type='huggingface' needs tokenizer.tokenizer_file (a tokenizer.json path)",
             "tokenizer.tokenizer_file")
    if t.tokenizer_type == "null" and not t.vocab_size:
        fail("tokenizer.tokenizer_type='null' needs tokenizer.vocab_size", "tokenizer.vocab_size")


BYTE_TOKENIZER_IDS = 258
"""Ids of the byte tokenizer before extra special tokens: 256 bytes, <eod>, <pad> (data/tokenizers.py)."""


@rule("tokenizer_vocab_fits", ("tokenizer.tokenizer_type", "tokenizer.vocab_size", "model.vocab_size"),
      "The byte and null tokenizers' ids fit in model.vocab_size (a huggingface tokenizer is checked when loaded).")
def _tokenizer_vocab(cfg: "ConfigContainer", world_size: int) -> None:
    t = cfg.tokenizer
    if t.tokenizer_type == "byte":
        size, what = BYTE_TOKENIZER_IDS + len(t.extra_special_tokens), "the byte tokenizer"
    elif t.tokenizer_type == "null" and t.vocab_size:
        size, what = t.vocab_size, "tokenizer.vocab_size"
    else:
        return
    if size > cfg.model.vocab_size:
        fail(f"{what} has {size} ids but model.vocab_size={cfg.model.vocab_size}: set model.vocab_size={size} (or "
             "larger)", "model.vocab_size", "tokenizer.tokenizer_type")


@rule("dataset_split", ("dataset.split",),
      "dataset.split is up to 3 non-negative numbers (train, valid, test) with a positive sum, e.g. '969,30,1'.")
def _dataset_split(cfg: "ConfigContainer", world_size: int) -> None:
    problem = split_problem(cfg.dataset.split)
    if problem:
        fail(problem, "dataset.split")


@rule("dataset_data_path", ("dataset.data_path",),
      "dataset.data_path entries are non-empty prefixes, or alternating weight, prefix pairs whose weights are finite, "
      ">= 0 and not all 0.")
def _dataset_data_path(cfg: "ConfigContainer", world_size: int) -> None:
    for problem in data_path_problems(cfg.dataset.data_path or []) if cfg.dataset.data_path is not None else ():
        fail(problem, "dataset.data_path")


@rule("tokenizer_settings", ("tokenizer.extra_special_tokens", "tokenizer.add_bos", "tokenizer.vocab_size"),
      "extra_special_tokens (byte tokenizer only) are unique and not `<eod>`/`<pad>`; add_bos=True needs a huggingface "
      "tokenizer; the null tokenizer has vocab_size >= 2.")
def _tokenizer_settings(cfg: "ConfigContainer", world_size: int) -> None:
    t = cfg.tokenizer
    extras = list(t.extra_special_tokens)
    if extras and t.tokenizer_type != "byte":
        fail(f"tokenizer.extra_special_tokens={extras!r} applies to the byte tokenizer only (tokenizer.tokenizer_type="
             f"{t.tokenizer_type!r}): add special tokens to the tokenizer.json instead, or set it to []",
             "tokenizer.extra_special_tokens")
    specials = [*RESERVED_TOKENS, *extras]
    if len(set(specials)) != len(specials):
        fail(f"tokenizer.extra_special_tokens={extras!r} repeats a token or reuses <eod>/<pad>: list each extra "
             "special token once", "tokenizer.extra_special_tokens")
    if t.add_bos and t.tokenizer_type != "huggingface":
        fail(f"tokenizer.add_bos=True needs a huggingface tokenizer; the {t.tokenizer_type} tokenizer has no BOS "
             "token: set tokenizer.add_bos=None", "tokenizer.add_bos")
    if t.tokenizer_type == "null" and t.vocab_size is not None and t.vocab_size < 2:
        fail(f"tokenizer.vocab_size={t.vocab_size} is too small for the null tokenizer (its last id is <eod>): set "
             "it to >= 2", "tokenizer.vocab_size")


@rule("mock_data_vocab", ("dataset.mock", "tokenizer.vocab_size"),
      "Mock data needs two ordinary ids besides `<eod>`: with the null tokenizer, tokenizer.vocab_size >= 3.")
def _mock_data_vocab(cfg: "ConfigContainer", world_size: int) -> None:
    t = cfg.tokenizer
    if cfg.dataset.mock and t.tokenizer_type == "null" and t.vocab_size is not None and 2 <= t.vocab_size < 3:
        fail(f"dataset.mock=True with the null tokenizer's tokenizer.vocab_size={t.vocab_size}: mock documents need "
             "two ordinary ids besides <eod>; set tokenizer.vocab_size >= 3 (or tokenizer.tokenizer_type='byte')",
             "tokenizer.vocab_size", "dataset.mock")


@rule("profiling_settings", ("profiling.profile_step_start", "profiling.profile_step_end", "profiling.estimate_gpu"),
      "With the profiler or memory history on, 0 <= profiling.profile_step_start <= profile_step_end; "
      "profiling.estimate_gpu is a GPU the estimate knows.")
def _profiling(cfg: "ConfigContainer", world_size: int) -> None:
    p = cfg.profiling
    if not (p.use_pytorch_profiler or p.record_memory_history):
        pass
    elif p.profile_step_start < 0:
        fail(f"profiling.profile_step_start must be >= 0 (got {p.profile_step_start})", "profiling.profile_step_start")
    elif p.profile_step_start > p.profile_step_end:
        fail(f"profiling.profile_step_start={p.profile_step_start} is after profiling.profile_step_end="
             f"{p.profile_step_end}: the profiler would record nothing; set profile_step_end >= profile_step_start",
             "profiling.profile_step_start", "profiling.profile_step_end")
    if p.estimate_gpu is not None and find_gpu(p.estimate_gpu) is None:
        fail(f"profiling.estimate_gpu={p.estimate_gpu!r} is not a GPU the estimate knows: use one of {known_gpus()} "
             "(or None for H100)", "profiling.estimate_gpu")
