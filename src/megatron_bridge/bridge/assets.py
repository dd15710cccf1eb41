"""Everything in a HF folder besides config and weights: tokenizer files, ``generation_config.json``, and the
special token ids written into ``config.json``.

On import these files are kept in the checkpoint (``iter_0000000/hf_assets/``); on export they are found, in
order, in: an explicit source folder, the checkpoint's ``hf_assets/``, the HF folder or checkpoint named by the
run's ``checkpoint.pretrained_checkpoint``, and the folder of ``tokenizer.tokenizer_file``.
"""

import json
import shutil
from pathlib import Path
from typing import Any

from megatron_bridge.bridge.hf_reader import CONFIG_FILENAME, read_json
from megatron_bridge.config.data import TokenizerConfig


HF_ASSETS_DIRNAME = "hf_assets"
"""Sub-folder of an imported checkpoint holding the source folder's config, generation config and tokenizer."""
GENERATION_CONFIG_FILENAME = "generation_config.json"
TOKENIZER_FILENAMES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
    "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
)
"""Files ``save_pretrained`` of a tokenizer writes (whichever exist are copied)."""
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def copy_assets(src: Path, dst: Path, *, with_config: bool) -> list[str]:
    """Copy the tokenizer files and ``generation_config.json`` (and ``config.json`` when asked) that exist in
    ``src`` into ``dst``; returns the names copied."""
    names = [*TOKENIZER_FILENAMES, GENERATION_CONFIG_FILENAME, *([CONFIG_FILENAME] if with_config else [])]
    copied = []
    for name in names:
        if (src / name).is_file():
            dst.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / name, dst / name)
            copied.append(name)
    return copied


def has_tokenizer(folder: Path) -> bool:
    """Whether ``folder`` holds a tokenizer (``tokenizer.json`` or ``tokenizer.model``)."""
    return (folder / "tokenizer.json").is_file() or (folder / "tokenizer.model").is_file()


def token_ids_from_config(folder: Path) -> dict[str, Any]:
    """The special token ids of a folder's ``config.json`` / ``generation_config.json`` (non-null ones)."""
    out: dict[str, Any] = {}
    for name in (GENERATION_CONFIG_FILENAME, CONFIG_FILENAME):
        if (folder / name).is_file():
            content = read_json(folder / name, name)
            out.update({k: content[k] for k in TOKEN_ID_KEYS if content.get(k) is not None and k not in out})
    return out


def token_ids_from_tokenizer(cfg: TokenizerConfig, vocab_size: int) -> dict[str, Any]:
    """Special ids of the tokenizer a run trained with: byte → eos ``<eod>`` 256, pad 257; huggingface → its
    end-of-document and pad ids (plus BOS from ``tokenizer_config.json``); null → eos = ``vocab_size - 1``."""
    if cfg.tokenizer_type == "null":
        return {"eos_token_id": (cfg.vocab_size or vocab_size) - 1}
    from megatron_bridge.data.tokenizers import build_tokenizer

    tok = build_tokenizer(cfg)
    out: dict[str, Any] = {"eos_token_id": tok.eod, "pad_token_id": tok.pad}
    bos = getattr(tok, "bos", None)
    if bos is not None:
        out["bos_token_id"] = bos
    return out


def generation_config(token_ids: dict[str, Any]) -> dict[str, Any]:
    """A ``generation_config.json`` as transformers derives it from a model config (token ids only)."""
    return {"_from_model_config": True, **{k: v for k, v in token_ids.items() if v is not None}}


def write_json(path: Path, content: dict[str, Any]) -> None:
    """Write ``content`` as indented JSON."""
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
