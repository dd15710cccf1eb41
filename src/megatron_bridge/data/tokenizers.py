"""Tokenizers: text ↔ token ids, built from ``cfg.tokenizer`` (:class:`TokenizerConfig`).

Three kinds:

* ``"byte"``: the 256 UTF-8 byte values, then ``<eod>``, ``<pad>`` and ``extra_special_tokens``; needs no file.
* ``"huggingface"``: a ``tokenizer.json`` loaded with the ``tokenizers`` package (no ``transformers``, no download).
* ``"null"``: ids only (pre-tokenized data); knows its vocabulary size and end-of-document id but cannot tokenize.
"""

import json
from abc import ABC, abstractmethod
from pathlib import Path

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.data import TokenizerConfig
from megatron_bridge.config.rule_set import enforce
from megatron_bridge.config.rules_data import RESERVED_TOKENS, TOKENIZER_RULES
from megatron_bridge.errors import ConfigValidationError, DataError
from megatron_bridge.utils.logging import get_logger, warn_once
from megatron_bridge.utils.paths import file_problem


logger = get_logger(__name__)

#: Names of end-of-document tokens looked up (in this order) in a Hugging Face tokenizer.json.
HF_EOD_CANDIDATES: tuple[str, ...] = (
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
    "<eos>",
    "<|eos|>",
    "<eod>",
    "[EOS]",
    "<|im_end|>",
    "[SEP]",
)
#: Names of padding tokens looked up in a Hugging Face tokenizer.json (the eod id is used when none is found).
HF_PAD_CANDIDATES: tuple[str, ...] = ("<pad>", "[PAD]", "<|padding|>", "<|pad|>", "<|finetune_right_pad_id|>")


class Tokenizer(ABC):
    """What the data pipeline needs from a tokenizer: ids of text, text of ids, and the special ids."""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids (every id is in ``[0, vocab_size)``)."""

    @property
    @abstractmethod
    def eod(self) -> int:
        """Id of the end-of-document token appended after every document."""

    @property
    @abstractmethod
    def pad(self) -> int:
        """Id of the padding token."""

    @abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` (no end-of-document token is added)."""

    @abstractmethod
    def detokenize(self, ids: list[int]) -> str:
        """Text of token ids."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, eod={self.eod}, pad={self.pad})"


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255, then ``<eod>`` (256), ``<pad>`` (257) and the extra special tokens.

    ``tokenize`` encodes the text's bytes only: special-token names inside the text are *not* turned into special
    ids (a corpus that contains the string ``"<eod>"`` stays intact). ``detokenize`` writes special ids as their
    names and replaces invalid UTF-8 with U+FFFD.
    """

    NUM_BYTES = 256

    def __init__(self, extra_special_tokens: list[str] | None = None) -> None:
        extras = list(extra_special_tokens or [])
        enforce(ConfigContainer.holding(TokenizerConfig(extra_special_tokens=extras)), "tokenizer_settings")
        specials = [*RESERVED_TOKENS, *extras]
        self._specials = specials
        self._special_to_id = {tok: self.NUM_BYTES + i for i, tok in enumerate(specials)}

    @property
    def vocab_size(self) -> int:
        """256 byte ids plus the special tokens."""
        return self.NUM_BYTES + len(self._specials)

    @property
    def eod(self) -> int:
        """Id of ``<eod>`` (256)."""
        return self._special_to_id["<eod>"]

    @property
    def pad(self) -> int:
        """Id of ``<pad>`` (257)."""
        return self._special_to_id["<pad>"]

    def special_token_id(self, token: str) -> int:
        """Id of a special token (``<eod>``, ``<pad>`` or one of ``extra_special_tokens``)."""
        if token not in self._special_to_id:
            raise DataError(f"{token!r} is not a special token of the byte tokenizer; known: {self._specials}")
        return self._special_to_id[token]

    def tokenize(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text`` as ids."""
        return list(text.encode("utf-8"))

    def detokenize(self, ids: list[int]) -> str:
        """Decode byte ids as UTF-8 (invalid sequences become U+FFFD); special ids become their names."""
        parts: list[str] = []
        buf = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < self.NUM_BYTES:
                buf.append(i)
                continue
            if not 0 <= i - self.NUM_BYTES < len(self._specials):
                raise DataError(f"token id {i} is outside the byte tokenizer's vocabulary [0, {self.vocab_size})")
            parts.append(buf.decode("utf-8", errors="replace"))
            buf = bytearray()
            parts.append(self._specials[i - self.NUM_BYTES])
        parts.append(buf.decode("utf-8", errors="replace"))
        return "".join(parts)


class HuggingFaceTokenizer(Tokenizer):
    """A Hugging Face ``tokenizer.json`` read with ``tokenizers.Tokenizer.from_file``.

    The end-of-document id is ``eod_token`` when given, else the ``eos_token`` of a ``tokenizer_config.json``
    next to the file, else the first of :data:`HF_EOD_CANDIDATES` in the vocabulary. The BOS id is the
    ``bos_token`` of ``tokenizer_config.json``, else the token the file's post-processor puts before the text.
    ``add_bos`` (None: as the post-processor does) makes :meth:`tokenize` prepend it, as ``AutoTokenizer`` does.
    """

    def __init__(self, tokenizer_file: str, eod_token: str | None = None, add_bos: bool | None = None) -> None:
        from tokenizers import Tokenizer as _HFTokenizer

        path = Path(tokenizer_file)
        problem = file_problem(path)
        if problem:
            raise DataError(
                f"tokenizer.tokenizer_file={tokenizer_file!r} {problem}; give the path of a Hugging Face "
                "tokenizer.json."
            )
        try:
            self._tok = _HFTokenizer.from_file(str(path))
        except Exception as e:  # the Rust library raises plain Exception subclasses
            raise DataError(f"cannot read the Hugging Face tokenizer file {str(path)!r}: {e}") from e
        self.path = str(path)
        self._vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self._eod = self._find_eod(path, eod_token)
        self._pad = self._find_pad()
        prefix = self._post_processor_prefix()
        self._bos = self._find_bos(path, prefix)
        self.add_bos = bool(prefix) if add_bos is None else add_bos
        if self.add_bos and self._bos is None:
            raise ConfigValidationError(
                f"tokenizer.add_bos=True but {str(path)!r} has no BOS token (no bos_token in tokenizer_config.json, "
                "no post-processor prefix); set tokenizer.add_bos=False.",
                ("tokenizer.add_bos",),
            )

    def _post_processor_prefix(self) -> list[int]:
        """Ids the file's post-processor puts before the text (e.g. ``[<|begin_of_text|>]``)."""
        plain = self._tok.encode("a b", add_special_tokens=False).ids
        full = self._tok.encode("a b", add_special_tokens=True).ids
        for start in range(len(full) - len(plain) + 1):
            if full[start : start + len(plain)] == plain:
                return list(full[:start])
        return []

    def _config_token_id(self, path: Path, key: str) -> int | None:
        """Id of the token ``tokenizer_config.json`` (next to ``path``) names under ``key``, if in the vocabulary."""
        config_path = path.with_name("tokenizer_config.json")
        if not config_path.is_file():
            return None
        try:
            token = json.loads(config_path.read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError, AttributeError):
            return None
        if isinstance(token, dict):
            token = token.get("content")
        tid = self._tok.token_to_id(token) if isinstance(token, str) else None
        return int(tid) if tid is not None else None

    def _find_bos(self, path: Path, prefix: list[int]) -> int | None:
        bos = self._config_token_id(path, "bos_token")
        if bos is not None:
            return bos
        return prefix[0] if len(prefix) == 1 else None

    def _find_eod(self, path: Path, eod_token: str | None) -> int:
        if eod_token is not None:
            tid = self._tok.token_to_id(eod_token)
            if tid is None:
                raise DataError(
                    f"tokenizer.eod_token={eod_token!r} is not in the vocabulary of {str(path)!r}; "
                    "set it to the file's end-of-text token."
                )
            return int(tid)
        eos = self._config_token_id(path, "eos_token")
        if eos is not None:
            return eos
        for name in HF_EOD_CANDIDATES:
            tid = self._tok.token_to_id(name)
            if tid is not None:
                return int(tid)
        raise DataError(
            f"the Hugging Face tokenizer {str(path)!r} has no end-of-document token with a known name "
            f"({', '.join(HF_EOD_CANDIDATES)}); set tokenizer.eod_token to the token that ends a document."
        )

    def _find_pad(self) -> int:
        padding = self._tok.padding
        if padding is not None and padding.get("pad_id") is not None and padding.get("pad_token"):
            if self._tok.token_to_id(padding["pad_token"]) is not None:
                return int(padding["pad_id"])
        for name in HF_PAD_CANDIDATES:
            tid = self._tok.token_to_id(name)
            if tid is not None:
                return int(tid)
        return self._eod

    @property
    def vocab_size(self) -> int:
        """Vocabulary size including added tokens."""
        return self._vocab_size

    @property
    def eod(self) -> int:
        """Id of the end-of-document token."""
        return self._eod

    @property
    def pad(self) -> int:
        """Id of the padding token (the eod id when the file has none)."""
        return self._pad

    @property
    def bos(self) -> int | None:
        """Id of the beginning-of-sequence token (None when the file has none)."""
        return self._bos

    def tokenize(self, text: str) -> list[int]:
        """Ids of ``text``, with the BOS id first when :attr:`add_bos` (no EOS: the data pipeline appends eod)."""
        ids = list(self._tok.encode(text, add_special_tokens=False).ids)
        return [self._bos, *ids] if self.add_bos and self._bos is not None else ids

    def detokenize(self, ids: list[int]) -> str:
        """Text of ids, special tokens kept."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


class NullTokenizer(Tokenizer):
    """Ids only, for data that is already tokenized: ``eod = vocab_size - 1``; cannot turn text into ids."""

    def __init__(self, vocab_size: int) -> None:
        enforce(ConfigContainer.holding(TokenizerConfig(tokenizer_type="null", vocab_size=vocab_size)),
                "tokenizer_settings")
        self._vocab_size = int(vocab_size)

    @property
    def vocab_size(self) -> int:
        """``tokenizer.vocab_size``."""
        return self._vocab_size

    @property
    def eod(self) -> int:
        """The last id, ``vocab_size - 1``."""
        return self._vocab_size - 1

    @property
    def pad(self) -> int:
        """Same as :attr:`eod`."""
        return self._vocab_size - 1

    def tokenize(self, text: str) -> list[int]:
        """Always raises: the null tokenizer has no text vocabulary."""
        raise DataError(
            "the null tokenizer (tokenizer.tokenizer_type='null') cannot tokenize text; use tokenizer_type='byte' "
            "or 'huggingface' to prepare data from text."
        )

    def detokenize(self, ids: list[int]) -> str:
        """The ids as space-separated numbers."""
        return " ".join(str(int(i)) for i in ids)


def build_tokenizer(cfg: TokenizerConfig) -> Tokenizer:
    """Build the tokenizer that ``cfg`` describes.

    Raises:
        ConfigValidationError: a rule of ``TOKENIZER_RULES`` (a required field is missing, an unknown
            tokenizer_type, extra special tokens or add_bos a tokenizer cannot have).
        DataError: the tokenizer file is missing or unreadable, or has no end-of-document token.
    """
    enforce(ConfigContainer.holding(cfg), *TOKENIZER_RULES)
    kind = cfg.tokenizer_type
    if kind == "byte":
        tok: Tokenizer = ByteTokenizer(cfg.extra_special_tokens)
    elif kind == "huggingface":
        tok = HuggingFaceTokenizer(str(cfg.tokenizer_file), eod_token=cfg.eod_token, add_bos=cfg.add_bos)
    else:
        tok = NullTokenizer(int(cfg.vocab_size))  # type: ignore[arg-type]  (rule tokenizer_file)
    if cfg.vocab_size is not None and kind != "null" and cfg.vocab_size != tok.vocab_size:
        warn_once(
            logger,
            f"tokenizer.vocab_size:{cfg.vocab_size}:{tok.vocab_size}",
            "tokenizer.vocab_size=%d is ignored: the %s tokenizer has %d ids (the field is for tokenizer_type='null')",
            cfg.vocab_size,
            kind,
            tok.vocab_size,
        )
    logger.debug("built tokenizer %r", tok)
    return tok
