"""Full-weight conversion between every format: the native engine's checkpoints, megatron-core's, one ``torch``
file and Hugging Face folders — the entry points of ``scripts/checkpoint/convert.py``.

Everything here works in one process without a model instance. Hugging Face folders are read and written by the
rest of the Bridge (every family it knows, every file arrangement, streamed, all-or-nothing output folders); the
engines' checkpoints are read by ``megatron_bridge.checkpoint`` and converted between engines by
:mod:`.engine_checkpoints`.

* :func:`read_model_weights` reads the model weights (full tensors, our parameter names) from any source: a
  checkpoint root (its latest step), an ``iter_NNNNNNN`` folder of any format (megatron-core ``torch_dist`` and
  Megatron FSDP ``fsdp_dtensor`` ones with the model config), a weights file written by
  :func:`write_torch_weights`, or a Hugging Face folder.
* :func:`write_torch_weights` writes ``{"model": {name: tensor}}`` (loads with ``torch.load(weights_only=True)``).
* :func:`convert_weights` converts any source to a ``torch`` file, a HF folder or one of our checkpoints.
"""

from pathlib import Path
from typing import Any

import torch

from megatron_bridge.bridge.hf_reader import is_hf_folder
from megatron_bridge.bridge.targets import TARGETS
from megatron_bridge.checkpoint.load import resolve_checkpoint_folder
from megatron_bridge.checkpoint.mcore_megatron_fsdp import is_fsdp_dtensor_folder
from megatron_bridge.checkpoint.mcore_reader import is_mcore_checkpoint
from megatron_bridge.checkpoint.reader import (
    VOCAB_KEYS,
    pad_rows,
    pad_vocab,
    read_dcp_model_weights,
    read_native_weights,
    read_weights_file,
)
from megatron_bridge.checkpoint.saved_run import read_model_config
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import CheckpointError


__all__ = ["TARGETS", "VOCAB_KEYS", "convert_weights", "is_hf_folder", "pad_rows", "pad_vocab",
           "read_dcp_model_weights", "read_hf_folder", "read_model_config", "read_model_weights",
           "resolve_checkpoint_folder", "write_hf_folder", "write_torch_output", "write_torch_weights"]



# -------------------------------------------------------------------------------------------------- reading
def read_model_weights(path: str | Path, *, step: int | None = None,
                       model_config: ModelConfig | None = None) -> dict[str, torch.Tensor]:
    """Full model weights (our names) from a checkpoint, a weights file or a HF folder (see module docstring).
    A megatron-core checkpoint needs the model config: ``model_config``, else its ``run_config.yaml``."""
    path = Path(path)
    if path.is_file():
        return read_weights_file(path)
    if is_hf_folder(path):
        return read_hf_folder(path)
    folder = resolve_checkpoint_folder(path, step)
    if is_mcore_checkpoint(folder):
        from megatron_bridge.bridge.engine_checkpoints import model_config_of, read_mcore_weights

        return read_mcore_weights(folder, model_config_of(folder, model_config))
    if is_fsdp_dtensor_folder(folder):  # Megatron FSDP on the megatron-core engine
        from megatron_bridge.bridge.engine_checkpoints import model_config_of, read_fsdp_dtensor_weights

        return read_fsdp_dtensor_weights(folder, model_config_of(folder, model_config))
    return read_native_weights(folder)


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
    from megatron_bridge.bridge.auto_bridge import AutoBridge
    from megatron_bridge.bridge.hf_reader import HFWeightsReader
    from megatron_bridge.bridge.weights import HFModelWeights

    bridge = AutoBridge.from_hf_pretrained(folder)
    weights = dict(HFModelWeights(HFWeightsReader(folder), bridge.family, bridge.to_megatron_provider(),
                                  pad_vocab=False))
    return pad_vocab(weights, padded_vocab_size) if padded_vocab_size is not None else weights


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
    from megatron_bridge.bridge.auto_bridge import AutoBridge

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
            return bridge.save_hf_pretrained(bridge.to_megatron_model(wrap_with_ddp=False), dst, **options)
        if src_path.is_file() and model_config is None:
            raise CheckpointError("HF export of a weights file needs the model config (--config run_config.yaml)")
        return AutoBridge.export_ckpt(src_path, dst, step=step, model_config=model_config, **hf_options)
    raise CheckpointError(f"unknown conversion target {to!r}: use one of {TARGETS}")


def _convert_between_engines(src: Path, dst: str | Path, to: str, step: int | None,
                             model_config: ModelConfig | None, overwrite: bool) -> Path:
    """Any source -> a megatron-core checkpoint (``to="megatron_core"``), or a megatron-core checkpoint -> a native
    one (``to="megatron"``); see :mod:`.engine_checkpoints`."""
    from megatron_bridge.bridge import engine_checkpoints
    from megatron_bridge.bridge.checkpoints import write_native_checkpoint

    cfg = engine_checkpoints.run_config_of(src, step, model_config)
    if is_hf_folder(src):
        weights = read_hf_folder(src, cfg.model.padded_vocab_size)
    else:
        weights = read_model_weights(src, step=step, model_config=cfg.model)
    if to == "megatron_core":
        return engine_checkpoints.write_mcore_checkpoint(weights, cfg, dst, overwrite)
    folder = resolve_checkpoint_folder(src, step)
    if not (is_mcore_checkpoint(folder) or is_fsdp_dtensor_folder(folder)):
        raise CheckpointError(f"--to megatron converts a Hugging Face folder or a megatron-core checkpoint; "
                              f"{str(src)!r} is already one of ours")
    return write_native_checkpoint(weights, cfg, dst, overwrite)
