"""``cfg.dataset`` and ``cfg.tokenizer``: where tokens come from."""

from dataclasses import dataclass, field
from typing import Literal

from megatron_bridge.config.declared import DeclaredFields


@dataclass(kw_only=True)
class DatasetConfig(DeclaredFields):
    """GPT pretraining data: a mock source of random tokens, or Megatron indexed ``.bin/.idx`` files with a blend."""

    mock: bool = True
    """Use deterministic random tokens instead of files; set False and give data_path to train on real data."""
    data_path: list[str] | None = None
    """Indexed dataset prefixes (without .bin/.idx), optionally weighted Megatron-style: ["0.7", "a", "0.3", "b"]."""
    split: str = "969,30,1"
    """Train/valid/test proportions of every dataset in data_path, e.g. "98,1,1"."""
    seq_length: int = 128
    """Tokens per sample; must equal model.seq_length."""
    random_seed: int = 1234
    """Seed of the sample shuffling and of the mock tokens."""
    num_workers: int = 0
    """DataLoader worker processes per rank (0 loads in the training process)."""
    pin_memory: bool = False
    """Pin host memory of batches (only useful with an accelerator)."""
    reset_position_ids: bool = False
    """Restart position ids after every end-of-document token."""
    eod_mask_loss: bool = False
    """Exclude end-of-document tokens from the loss."""
    mock_num_samples: int = 1_000_000
    """Number of distinct samples of the mock dataset (it wraps around after that)."""
    cache_dir: str | None = None
    """Where shuffle indices of indexed datasets are cached; None keeps them in memory."""


@dataclass(kw_only=True)
class TokenizerConfig(DeclaredFields):
    """The tokenizer that turns text into ids (for data preparation and for the vocab size)."""

    tokenizer_type: Literal["byte", "huggingface", "null"] = "byte"
    """"byte": UTF-8 bytes plus special tokens, no download; "huggingface": a tokenizer.json file; "null": ids only.
    Differs from Megatron-Bridge's names ("HuggingFaceTokenizer", "NullTokenizer", ...): no Hub downloads here."""
    tokenizer_file: str | None = None
    """Path to a Hugging Face tokenizer.json (required for tokenizer_type="huggingface")."""
    vocab_size: int | None = None
    """Vocabulary size for tokenizer_type="null"; other types know their own size."""
    extra_special_tokens: list[str] = field(default_factory=list)
    """Additional special tokens appended to the byte tokenizer's vocabulary."""
    eod_token: str | None = None
    """End-of-document token of a huggingface tokenizer.json whose eos token has an unusual name, e.g. "<|end|>"."""
    add_bos: bool | None = None
    """Prepend the beginning-of-sequence token to every document (huggingface tokenizers). None does what the
    Hugging Face tokenizer does: BOS when its tokenizer.json post-processor adds one (Llama 3's <|begin_of_text|>),
    none otherwise (Qwen3). True needs a BOS token (tokenizer_config.json bos_token); the byte tokenizer has none."""
