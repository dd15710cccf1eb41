"""Data: tokenizers, Megatron indexed datasets, GPT samples, blends, mock data, samplers and DataLoaders.

Modules: ``tokenizers`` (text ↔ ids), ``indexed`` (.bin/.idx files), ``gpt_dataset`` (fixed-length samples and
splits), ``blended`` (weighted blends), ``mock`` (learnable synthetic data), ``samplers`` (per-rank micro-batches),
``loaders`` (the train/valid/test DataLoaders), ``preprocess`` (JSONL → .bin/.idx) and ``corpus`` (the shipped
text corpus).
"""

from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from megatron_bridge.data.blended import BlendedDataset, build_blending_indices
    from megatron_bridge.data.corpus import default_corpus_path, ensure_corpus_indexed
    from megatron_bridge.data.gpt_dataset import GPTDataset, parse_split, split_ranges
    from megatron_bridge.data.indexed import IndexedDataset, IndexedDatasetBuilder, optimal_dtype
    from megatron_bridge.data.loaders import (
        PretrainingDataLoaders,
        build_pretraining_data_loaders,
        build_pretraining_datasets,
        cyclic_iter,
        parse_data_path,
    )
    from megatron_bridge.data.mock import MockGPTDataset
    from megatron_bridge.data.preprocess import PreprocessSummary, preprocess_jsonl
    from megatron_bridge.data.samplers import PretrainingSampler
    from megatron_bridge.data.tokenizers import (
        ByteTokenizer,
        HuggingFaceTokenizer,
        NullTokenizer,
        Tokenizer,
        build_tokenizer,
    )

# Public name -> module. Submodules are imported on first use, so that light tools (the preprocessing CLI)
# do not pay for importing torch.
_EXPORTS: dict[str, str] = {
    "BlendedDataset": "megatron_bridge.data.blended",
    "ByteTokenizer": "megatron_bridge.data.tokenizers",
    "GPTDataset": "megatron_bridge.data.gpt_dataset",
    "HuggingFaceTokenizer": "megatron_bridge.data.tokenizers",
    "IndexedDataset": "megatron_bridge.data.indexed",
    "IndexedDatasetBuilder": "megatron_bridge.data.indexed",
    "MockGPTDataset": "megatron_bridge.data.mock",
    "NullTokenizer": "megatron_bridge.data.tokenizers",
    "PreprocessSummary": "megatron_bridge.data.preprocess",
    "PretrainingDataLoaders": "megatron_bridge.data.loaders",
    "PretrainingSampler": "megatron_bridge.data.samplers",
    "Tokenizer": "megatron_bridge.data.tokenizers",
    "build_blending_indices": "megatron_bridge.data.blended",
    "build_pretraining_data_loaders": "megatron_bridge.data.loaders",
    "build_pretraining_datasets": "megatron_bridge.data.loaders",
    "build_tokenizer": "megatron_bridge.data.tokenizers",
    "cyclic_iter": "megatron_bridge.data.loaders",
    "default_corpus_path": "megatron_bridge.data.corpus",
    "ensure_corpus_indexed": "megatron_bridge.data.corpus",
    "optimal_dtype": "megatron_bridge.data.indexed",
    "parse_data_path": "megatron_bridge.data.loaders",
    "parse_split": "megatron_bridge.data.gpt_dataset",
    "preprocess_jsonl": "megatron_bridge.data.preprocess",
    "split_ranges": "megatron_bridge.data.gpt_dataset",
}

__all__ = [
    "BlendedDataset",
    "ByteTokenizer",
    "GPTDataset",
    "HuggingFaceTokenizer",
    "IndexedDataset",
    "IndexedDatasetBuilder",
    "MockGPTDataset",
    "NullTokenizer",
    "PreprocessSummary",
    "PretrainingDataLoaders",
    "PretrainingSampler",
    "Tokenizer",
    "build_blending_indices",
    "build_pretraining_data_loaders",
    "build_pretraining_datasets",
    "build_tokenizer",
    "cyclic_iter",
    "default_corpus_path",
    "ensure_corpus_indexed",
    "optimal_dtype",
    "parse_data_path",
    "parse_split",
    "preprocess_jsonl",
    "split_ranges",
]


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
