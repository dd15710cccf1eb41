"""Full-weight conversion between our checkpoints, one ``torch`` file and Hugging Face folders.

Everything here works in one process without a model instance; ``scripts/checkpoint/convert.py`` is the CLI.
Hugging Face folders are read and written by the Bridge (:mod:`megatron_bridge.bridge`): every family it knows,
every folder layout, streamed, all-or-nothing output folders. This module keeps the entry points the CLI and the
loader call:

* :func:`read_model_weights` reads the model weights (full tensors, our parameter names) from any source: a
  checkpoint root (its latest step), an ``iter_NNNNNNN`` folder of any format, a weights file written by
  :func:`write_torch_weights`, or a Hugging Face folder.
* :func:`write_torch_weights` writes ``{"model": {name: tensor}}`` (loads with ``torch.load(weights_only=True)``).
* :func:`convert_weights` converts any source to a ``torch`` file, a HF folder or one of our checkpoints.
"""

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from megatron_bridge.checkpoint import layout
from megatron_bridge.checkpoint.mcore_reader import is_mcore_checkpoint
from megatron_bridge.checkpoint.reader import (
    DCP_ERRORS,
    SafeFileSystemReader,
    SafeLoadPlanner,
    check_dcp_storage,
    dcp_error_message,
    latest_step,
    load_torch_file,
    read_dcp_metadata,
)
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import CheckpointError


VOCAB_KEYS = ("embed_tokens.weight", "lm_head.weight")
"""Our parameters whose rows are the (padded) vocabulary."""
TARGETS = ("torch", "hf", "megatron", "megatron_core")
"""What :func:`convert_weights` writes: a torch file, a HF folder, one of our (native engine) checkpoints, a
megatron-core torch_dist checkpoint (the megatron-core engine's; :mod:`.mcore_convert`)."""


# ------------------------------------------------------------------------------------------------- detection
def is_hf_folder(path: str | Path) -> bool:
    """True for a folder with ``config.json`` and HF weights (single or sharded safetensors, or ``.bin``)."""
    from megatron_bridge.bridge.hf_reader import is_hf_folder as _is_hf_folder

    return _is_hf_folder(path)


def resolve_checkpoint_folder(path: str | Path, step: int | None = None) -> Path:
    """The ``iter_NNNNNNN`` folder meant by ``path``: itself, or (for a checkpoint root) ``step`` or the latest."""
    path = Path(path)
    if layout.step_of(path) is not None or (path / layout.MANIFEST_FILENAME).is_file():
        return path
    if step is None:
        step = latest_step(path)  # the step training resumes from (train state tracker, text tracker, newest)
    if step is None:
        raise CheckpointError(f"{str(path)!r} holds no checkpoint (no tracker file and no iter_* folder)")
    folder = layout.iteration_dir(path, step)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {str(folder)!r} does not exist")
    return folder


# -------------------------------------------------------------------------------------------------- reading
def read_model_weights(path: str | Path, *, step: int | None = None,
                       model_config: ModelConfig | None = None) -> dict[str, torch.Tensor]:
    """Full model weights (our names) from a checkpoint, a weights file or a HF folder (see module docstring).
    A megatron-core checkpoint needs the model config: ``model_config``, else its ``run_config.yaml``."""
    path = Path(path)
    if path.is_file():
        return _weights_from_file(path)
    if is_hf_folder(path):
        return read_hf_folder(path)
    folder = resolve_checkpoint_folder(path, step)
    if is_mcore_checkpoint(folder):
        from megatron_bridge.checkpoint.mcore_convert import model_config_of, read_mcore_weights

        return read_mcore_weights(folder, model_config_of(folder, model_config))
    manifest = layout.verify_manifest(folder)
    if manifest.get("format") == "torch" or (folder / layout.TORCH_FILENAME).is_file():
        return _weights_from_file(folder / layout.TORCH_FILENAME)
    return read_dcp_model_weights(folder)


def _weights_from_file(path: Path) -> dict[str, torch.Tensor]:
    content = load_torch_file(path, "weights")
    weights = content.get("model", content) if isinstance(content, dict) else None
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise CheckpointError(f"{str(path)!r} holds no {{name: tensor}} model weights")
    return weights


def read_dcp_model_weights(folder: str | Path, prefix: str = "model") -> dict[str, torch.Tensor]:
    """The full tensors under ``prefix`` of a DCP checkpoint, read in this process only (no process group)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = read_dcp_metadata(folder)
    check_dcp_storage(folder, metadata)
    state: dict[str, torch.Tensor] = {}
    for key, item in metadata.state_dict_metadata.items():
        if key.startswith(prefix + ".") and isinstance(item, TensorStorageMetadata):
            state[key[len(prefix) + 1 :]] = torch.empty(item.size, dtype=item.properties.dtype)
    if not state:
        raise CheckpointError(f"DCP checkpoint {str(folder)!r} holds no '{prefix}' tensors")
    try:
        dcp.load({prefix: state}, storage_reader=SafeFileSystemReader(folder), planner=SafeLoadPlanner(),
                 no_dist=True)
    except CheckpointError:
        raise
    except DCP_ERRORS as exc:
        raise CheckpointError(f"reading DCP checkpoint {str(folder)!r} failed: {dcp_error_message(exc)}") from exc
    return state


def read_model_config(folder: str | Path) -> ModelConfig:
    """The ``model`` section of a checkpoint's ``run_config.yaml`` (safe YAML loader)."""
    from megatron_bridge.config.container import ConfigContainer

    path = Path(folder) / layout.RUN_CONFIG_FILENAME
    if not path.is_file():
        raise CheckpointError(f"{str(path)!r} does not exist: pass the model config explicitly")
    try:
        return ConfigContainer.from_yaml(path).model
    except ValueError as exc:
        raise CheckpointError(f"{str(path)!r} is not a valid run config: {exc}") from exc


# ------------------------------------------------------------------------------------------------------ HF
def write_hf_folder(weights: dict[str, torch.Tensor], config: ModelConfig, out_dir: str | Path,
                    **options: Any) -> Path:
    """Write ``weights`` (our names) as a HF folder of the family that fits ``config`` (vocabulary unpadded to
    ``config.vocab_size``); ``options`` go to :func:`megatron_bridge.bridge.exporting.write_hf_pretrained`."""
    from megatron_bridge.bridge.exporting import write_hf_pretrained
    from megatron_bridge.bridge.families import family_for_model_config

    return write_hf_pretrained(out_dir, family_for_model_config(config), config, weights.items(), **options)


def read_hf_folder(folder: str | Path, padded_vocab_size: int | None = None) -> dict[str, torch.Tensor]:
    """Weights of a HF folder under our names; vocabulary rows zero-padded to ``padded_vocab_size`` when
    given (None keeps the HF rows)."""
    from megatron_bridge.bridge import AutoBridge
    from megatron_bridge.bridge.hf_reader import HFWeightsReader
    from megatron_bridge.bridge.weights import HFModelWeights

    bridge = AutoBridge.from_hf_pretrained(folder)
    weights = dict(HFModelWeights(HFWeightsReader(folder), bridge.family, bridge.to_megatron_provider(),
                                  pad_vocab=False))
    return pad_vocab(weights, padded_vocab_size) if padded_vocab_size is not None else weights


def pad_vocab(weights: dict[str, torch.Tensor], padded_vocab_size: int) -> dict[str, torch.Tensor]:
    """``weights`` with the vocabulary rows of the embedding and output layer zero-padded to
    ``padded_vocab_size``."""
    return {k: pad_rows(v, padded_vocab_size) if k in VOCAB_KEYS and v.shape[0] < padded_vocab_size else v
            for k, v in weights.items()}


def pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``tensor`` with zero rows appended up to ``rows``."""
    pad = tensor.new_zeros((rows - tensor.shape[0], *tensor.shape[1:]))
    return torch.cat([tensor, pad], dim=0)


# -------------------------------------------------------------------------------------------------- writing
def write_torch_weights(weights: dict[str, torch.Tensor], path: str | Path) -> Path:
    """Write ``{"model": weights}`` to one file (``torch.load(weights_only=True)`` reads it back)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": {k: v.detach().cpu().contiguous() for k, v in weights.items()}}, path)
    return path


def write_torch_output(weights: dict[str, torch.Tensor], dst: str | Path, overwrite: bool) -> Path:
    """:func:`write_torch_weights` to a temporary file renamed to ``dst`` when complete (an error leaves ``dst`` as
    it was); an existing ``dst`` needs ``overwrite`` (CheckpointError otherwise)."""
    from megatron_bridge.utils.atomic import atomic_output

    if Path(dst).exists() and not overwrite:
        raise CheckpointError(f"output {str(dst)!r} already exists: pass --overwrite (overwrite=True) to replace it, "
                              "or choose another output path")
    with atomic_output(dst) as tmp:
        write_torch_weights(weights, tmp)
    return Path(dst)


def convert_weights(src: str | Path, dst: str | Path, to: str, *, step: int | None = None,
                    model_config: ModelConfig | None = None, **hf_options: Any) -> Path:
    """Convert ``src`` (any source :func:`read_model_weights` accepts) to ``to`` = "torch" (a file), "hf" (a
    folder) or "megatron" (one of our checkpoints, from a HF folder). HF export of a checkpoint takes the model
    config from its run_config.yaml (``model_config`` for a weights file); ``hf_options`` (``weight_dtype``,
    ``max_shard_size``, ``overwrite``, ``rope_format``, ``source_path``, ``family``) go to the Bridge."""
    from megatron_bridge.bridge import AutoBridge

    src_path = Path(src)
    if to == "megatron_core" or (to == "megatron" and src_path.is_dir() and not is_hf_folder(src_path)):
        return _convert_between_engines(src_path, dst, to, step, model_config, bool(hf_options.get("overwrite")))
    if to == "torch":
        return write_torch_output(read_model_weights(src, step=step), dst, bool(hf_options.get("overwrite")))
    if to == "megatron":
        if not is_hf_folder(src_path):
            raise CheckpointError(f"--to megatron converts a Hugging Face folder; {str(src)!r} is not one")
        dtype = hf_options.get("weight_dtype")
        return AutoBridge.import_ckpt(src_path, dst, overwrite=bool(hf_options.get("overwrite")),
                                      **({"dtype": dtype} if dtype else {}))
    if to == "hf":
        if is_hf_folder(src_path):
            bridge = AutoBridge.from_hf_pretrained(src_path)
            options = {k: v for k, v in hf_options.items() if k != "family"}
            return bridge.save_hf_pretrained(bridge.to_megatron_model(), dst, **options)
        if src_path.is_file() and model_config is None:
            raise CheckpointError("HF export of a weights file needs the model config (--config run_config.yaml)")
        return AutoBridge.export_ckpt(src_path, dst, step=step, model_config=model_config, **hf_options)
    raise CheckpointError(f"unknown conversion target {to!r}: use one of {TARGETS}")


def _convert_between_engines(src: Path, dst: str | Path, to: str, step: int | None,
                             model_config: ModelConfig | None, overwrite: bool) -> Path:
    """Any source -> a megatron-core checkpoint (``to="megatron_core"``), or a megatron-core checkpoint -> a native
    one (``to="megatron"``); see :mod:`.mcore_convert`."""
    from megatron_bridge.checkpoint import mcore_convert

    cfg = mcore_convert.run_config_of(src, step, model_config)
    if is_hf_folder(src):
        weights = read_hf_folder(src, cfg.model.padded_vocab_size)
    else:
        weights = read_model_weights(src, step=step, model_config=cfg.model)
    if to == "megatron_core":
        return mcore_convert.write_mcore_checkpoint(weights, cfg, dst, overwrite)
    if not is_mcore_checkpoint(resolve_checkpoint_folder(src, step)):
        raise CheckpointError(f"--to megatron converts a Hugging Face folder or a megatron-core checkpoint; "
                              f"{str(src)!r} is already one of ours")
    return mcore_convert.write_native_checkpoint(weights, cfg, dst, overwrite)
