"""What ``AutoBridge`` needs beyond a whole HF folder: the run config of a model-only checkpoint
(``save_megatron_model``; the writer is :func:`megatron_bridge.bridge.checkpoints.save_model_checkpoint`), the
model-parallel overrides of ``load_megatron_model``, HF safetensors weights alone (``save_hf_weights``), and the
per-parameter conversion plan (``get_conversion_tasks``)."""

import os
import shutil
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import torch
from torch import nn

from megatron_bridge.bridge.families import ModelFamily
from megatron_bridge.bridge.weights import write_hf_weights
from megatron_bridge.checkpoint.files import fsync_dir, fsync_tree
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import DType, ModelConfig
from megatron_bridge.errors import BridgeError, PathError
from megatron_bridge.utils.paths import describe_path


def checkpoint_run_config(config: ModelConfig, tokenizer_folder: Path | None, assets: Path) -> ConfigContainer:
    """The ``run_config.yaml`` of a model-only checkpoint: the model, its sequence length, and the tokenizer of
    ``tokenizer_folder`` as copied to ``assets`` (its ``tokenizer.json``), else the null tokenizer."""
    from megatron_bridge.config.data import TokenizerConfig

    cfg = ConfigContainer(model=ModelConfig(**{k: getattr(config, k) for k in ModelConfig.__dataclass_fields__}))
    cfg.dataset.seq_length = config.seq_length
    has_tokenizer = tokenizer_folder is not None and (tokenizer_folder / "tokenizer.json").is_file()
    cfg.tokenizer = (TokenizerConfig(tokenizer_type="huggingface", tokenizer_file=str(assets / "tokenizer.json"))
                     if has_tokenizer else TokenizerConfig(tokenizer_type="null", vocab_size=config.vocab_size))
    return cfg


MP_OVERRIDE_FIELDS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                      "expert_model_parallel_size", "expert_tensor_parallel_size",
                      "virtual_pipeline_model_parallel_size", "sequence_parallel",
                      "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                      "pipeline_model_parallel_layout", "pipeline_dtype", "params_dtype")
"""The model fields ``load_megatron_model(mp_overrides=...)`` may set: Megatron-Bridge's ``ModelParallelKwargs``
that this library has, and ``params_dtype``, which its examples pass too. The dtypes take a ``torch.dtype`` or its
name."""
PRECISION_FLAGS = {"bf16": "bfloat16", "fp16": "float16"}
"""``mp_overrides`` switches of Megatron-Bridge's examples (``"bf16": True``): the ``params_dtype`` they stand for."""


def _dtype_name(value: Any) -> Any:
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value


def _precision_flags(overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` with ``bf16``/``fp16`` replaced by the ``params_dtype`` they stand for (False: nothing)."""
    out = {k: v for k, v in overrides.items() if k not in PRECISION_FLAGS}
    for flag, dtype in PRECISION_FLAGS.items():
        if overrides.get(flag):
            given = _dtype_name(out.setdefault("params_dtype", dtype))
            if given != dtype:
                raise BridgeError(f"load_megatron_model(mp_overrides={{{flag!r}: True, 'params_dtype': {given!r}}}): "
                                  f"{flag}=True means params_dtype {dtype!r}; give one of them")
    return out


def apply_mp_overrides(config: ModelConfig, mp_overrides: Mapping[str, Any] | None) -> None:
    """Set ``mp_overrides``' model-parallel fields and dtypes on ``config``; BridgeError for any other key or a dtype
    the model cannot be stored in."""
    for key, value in _precision_flags(dict(mp_overrides or {})).items():
        if key not in MP_OVERRIDE_FIELDS or not hasattr(config, key):
            raise BridgeError(f"load_megatron_model(mp_overrides={{{key!r}: ...}}): not a model-parallel field; use "
                              f"one of {list(MP_OVERRIDE_FIELDS) + list(PRECISION_FLAGS)}")
        allowed = (*get_args(DType), *((None,) if key == "pipeline_dtype" else ()))
        if key.endswith("_dtype") and _dtype_name(value) not in allowed:
            raise BridgeError(f"load_megatron_model(mp_overrides={{{key!r}: {value!r}}}): use one of "
                              f"{list(allowed)} (or the torch dtype)")
        setattr(config, key, value)


def save_hf_safetensors(path: Path, family: ModelFamily, config: ModelConfig,
                        pairs: Iterator[tuple[str, torch.Tensor]], dtype: torch.dtype,
                        max_shard_size: int | str, overwrite: bool = False) -> list[str]:
    """Write the HF safetensors files (and their index when sharded) of ``pairs`` (our names, full tensors) into
    ``path`` (created); no config or tokenizer. Other files in ``path`` stay; safetensors weights already there are
    refused unless ``overwrite`` (then the old set is removed, stale shards included). The files are written into a
    hidden folder inside ``path`` and moved into place only when all are complete. Returns the file names."""
    if path.exists() and not path.is_dir():
        raise PathError(f"save_hf_weights: {str(path)!r} is {describe_path(path)}, not a folder; choose a folder path")
    old = sorted(p.name for p in path.glob("model*.safetensors*")) if path.is_dir() else []
    if old and not overwrite:
        raise BridgeError(f"save_hf_weights: {str(path)!r} already holds weights {old[:4]}; choose a new folder or "
                          "pass overwrite=True to replace them (the folder's other files are kept)")
    path.mkdir(parents=True, exist_ok=True)
    stage = path / f".weights.tmp-{uuid.uuid4().hex[:12]}"
    stage.mkdir()
    try:
        written = write_hf_weights(stage, pairs, family, config, dtype, max_shard_size)
        fsync_tree(stage)
        for name in old:
            if name not in written:
                (path / name).unlink(missing_ok=True)
        for name in written:
            os.replace(stage / name, path / name)
        fsync_dir(path)
        return written
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@dataclass(frozen=True)
class ParamMapping:
    """How one of our parameters maps to Hugging Face tensors (``task.mapping`` as in Megatron-Bridge)."""

    megatron_param: str
    """Our parameter name."""
    hf_param: str | tuple[str, ...]
    """The HF tensor name, or the names stacked into it (MoE experts)."""


@dataclass(frozen=True)
class WeightConversionTask:
    """One parameter's conversion, Megatron-Bridge's ``WeightConversionTask`` fields."""

    param_name: str
    """Our parameter name (in the unwrapped chunk)."""
    mapping: ParamMapping
    """The HF name(s) it converts to and from."""
    pp_rank: int
    """The pipeline rank that holds it."""
    vp_stage: int | None
    """The virtual stage (index of the chunk) that holds it; None without virtual stages."""
    megatron_module: nn.Module
    """The unwrapped chunk that owns it."""
    param_weight: torch.Tensor
    """The parameter itself (a DTensor shard under FSDP2 / TP)."""


def conversion_tasks(family: ModelFamily, config: ModelConfig, modules: Sequence[nn.Module],
                     pp_rank: int) -> list[WeightConversionTask]:
    """The tasks of every parameter of ``modules`` (the unwrapped chunks); BridgeError for a parameter the family
    does not map."""
    names = family.weight_names(config)
    stacked = family.stacked_weights(config)
    interleaved = family.interleaved_weights(config)
    tasks = []
    for index, module in enumerate(modules):
        for name, param in module.named_parameters():
            hf: str | tuple[str, ...] | None = names.get(name)
            if hf is None and name in stacked:
                hf = tuple(stacked[name].hf_names)
            if hf is None and name in interleaved:
                hf = interleaved[name].hf_name
            if hf is None:
                raise BridgeError(f"parameter {name!r} has no Hugging Face name in the {family.name} mapping")
            tasks.append(WeightConversionTask(name, ParamMapping(name, hf), pp_rank,
                                              index if len(modules) > 1 else None, module, param))
    return tasks
