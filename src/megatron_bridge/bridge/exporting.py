"""Writing a HF folder from ``(our name, tensor)`` pairs, and finding the files an export carries over.

The folder (``config.json``, ``generation_config.json``, safetensors shards + index, tokenizer files) is written
into a hidden sibling and renamed into place when complete (:func:`staged_output_dir`).
"""

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from megatron_bridge.bridge.assets import (
    GENERATION_CONFIG_FILENAME,
    HF_ASSETS_DIRNAME,
    TOKENIZER_FILENAMES,
    copy_assets,
    generation_config,
    has_tokenizer,
    token_ids_from_config,
    token_ids_from_tokenizer,
    write_json,
)
from megatron_bridge.bridge.config_out import exported_hf_config, valid_token_ids
from megatron_bridge.bridge.families.base import ModelFamily
from megatron_bridge.bridge.hf_reader import CONFIG_FILENAME, is_hf_folder, read_json
from megatron_bridge.bridge.hf_writer import DEFAULT_MAX_SHARD_SIZE
from megatron_bridge.bridge.output import staged_output_dir
from megatron_bridge.bridge.rope import RopeFormat
from megatron_bridge.bridge.weights import write_hf_weights
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import MegatronBridgeError
from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
_MAX_DEPTH = 4


def write_hf_pretrained(path: str | Path, family: ModelFamily, config: ModelConfig,
                        pairs: Iterable[tuple[str, torch.Tensor]], *, weight_dtype: torch.dtype | None = None,
                        max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE, overwrite: bool = False,
                        rope_format: RopeFormat | None = None, asset_sources: Iterable[Path] = (),
                        token_ids: dict[str, Any] | None = None) -> Path:
    """Write a complete HF folder at ``path``; returns it.

    Args:
        pairs: ``(our name, full tensor)`` for every parameter, consumed one at a time.
        weight_dtype: dtype of the written floating-point tensors; None keeps ``config.params_dtype``.
        asset_sources: folders searched, in order, for tokenizer files, ``generation_config.json`` and a source
            ``config.json`` (its special token ids and RoPE format are kept).
        token_ids: special token ids used when no source folder states them.
    """
    from megatron_bridge.models.llama import params_dtype_of

    sources = [Path(s) for s in asset_sources if Path(s).is_dir()]
    base = next((read_json(s / CONFIG_FILENAME, "config") for s in sources if (s / CONFIG_FILENAME).is_file()), None)
    ids = next((t for t in (token_ids_from_config(s) for s in sources) if t), None) or dict(token_ids or {})
    dtype = weight_dtype or params_dtype_of(config)
    path = Path(path)
    with staged_output_dir(path, overwrite=overwrite) as tmp:
        files = write_hf_weights(tmp, pairs, family, config, dtype, max_shard_size)
        hf = exported_hf_config(family, config, dtype=DTYPE_NAMES[dtype], rope_format=rope_format, source=base,
                                token_ids=ids)
        write_json(tmp / CONFIG_FILENAME, hf)
        tokenizer_src = next((s for s in sources if has_tokenizer(s)), None)
        copied = copy_assets(tokenizer_src, tmp, with_config=False) if tokenizer_src else []
        generation_src = next((s for s in sources if (s / GENERATION_CONFIG_FILENAME).is_file()), None)
        if generation_src is not None and GENERATION_CONFIG_FILENAME not in copied:
            copy_assets_file(generation_src, tmp, GENERATION_CONFIG_FILENAME)
        elif generation_src is None:
            write_json(tmp / GENERATION_CONFIG_FILENAME, generation_config(valid_token_ids(ids, config.vocab_size)))
    logger.info("wrote %s: %s weight file(s), tokenizer from %s", path, len(files), tokenizer_src or "nowhere")
    return path


def copy_assets_file(src: Path, dst: Path, name: str) -> None:
    """Copy one file ``src/name`` to ``dst/name``."""
    (dst / name).write_bytes((src / name).read_bytes())


def asset_sources_of_run(folder: Path | None, run: ConfigContainer | None, depth: int = 0) -> list[Path]:
    """Folders an export of a checkpoint takes its HF files from: the checkpoint's ``hf_assets/``, then (followed
    recursively) the run's ``checkpoint.pretrained_checkpoint``, then the folder of ``tokenizer.tokenizer_file``."""
    from megatron_bridge.bridge.checkpoints import CheckpointTensors

    out: list[Path] = []
    if folder is not None and (folder / HF_ASSETS_DIRNAME).is_dir():
        out.append(folder / HF_ASSETS_DIRNAME)
    if run is None or depth >= _MAX_DEPTH:
        return out
    pretrained = run.checkpoint.pretrained_checkpoint
    if pretrained and Path(pretrained).exists():
        if is_hf_folder(pretrained):
            out.append(Path(pretrained))
        elif Path(pretrained).is_dir():
            try:
                parent = CheckpointTensors(pretrained)
                out += asset_sources_of_run(parent.folder, parent.run_config(), depth + 1)
            except MegatronBridgeError as exc:
                logger.info("not taking HF files from pretrained_checkpoint %s: %s", pretrained, exc)
    if run.tokenizer.tokenizer_file and Path(run.tokenizer.tokenizer_file).is_file():
        out.append(Path(run.tokenizer.tokenizer_file).parent)
    return out


def token_ids_of_run(run: ConfigContainer | None, vocab_size: int) -> dict[str, Any]:
    """Special ids from the run's tokenizer config (empty when it cannot be built here)."""
    if run is None:
        return {}
    try:
        return token_ids_from_tokenizer(run.tokenizer, vocab_size)
    except MegatronBridgeError as exc:
        logger.warning("no special token ids for config.json: the run's tokenizer cannot be built here (%s)", exc)
        return {}


__all__ = ["DTYPES", "DTYPE_NAMES", "TOKENIZER_FILENAMES", "asset_sources_of_run", "token_ids_of_run",
           "write_hf_pretrained"]
