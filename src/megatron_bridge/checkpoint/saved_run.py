"""What a checkpoint folder says about the run that wrote it, and whether that run's optimizer state fits this one.

A megatron-core engine checkpoint holds the optimizer state of the precision it was trained in (Megatron-Bridge's
meaning of ``mixed_precision``, docs/training/engines.md): ``fp32`` runs save megatron-core's ``FP32Optimizer`` state
(Adam moments of the fp32 weights), ``bf16_mixed``/``fp16_mixed`` runs ``Float16OptimizerWithFloat16Params``'s (fp32
main parameters ``fp32_param.<param>`` beside the moments; fp16's loss scaler) or, with the distributed optimizer, its
fp32 main-parameter shards. Loading one precision's optimizer into another's is refused by :func:`check_precision`
with a :class:`PrecisionMismatchError` that names both precisions, the folder and the two fixes, before any tensor is
read: an fp32 checkpoint lacks the main parameters a bf16 run needs (megatron-core would fail on missing keys), and a
bf16 checkpoint loaded into an fp32 run would silently take the bf16-rounded weights and drop its fp32 main
parameters. Megatron-Bridge does not check this (its load fails on the missing keys, or goes through silently).

The precision comes from the folder's ``run_config.yaml`` (ours and Megatron-Bridge's both record
``optimizer.bf16`` / ``optimizer.fp16``), read with ``yaml.safe_load``; a folder without one (Megatron-LM) is judged
by the dtypes of its model tensors in the DCP metadata. Checkpoints are untrusted: anything unexpected means
"unknown", and unknown is never refused here.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from megatron_bridge.checkpoint.files import RUN_CONFIG_FILENAME
from megatron_bridge.errors import CheckpointError


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.config.model import ModelConfig

PRECISIONS = ("fp32", "bf16_mixed", "fp16_mixed")
"""The precisions a checkpoint's optimizer state can belong to (the ``mixed_precision`` presets that set them)."""
_STATE_OF = {
    "fp32": "fp32 weights, Adam state of megatron-core's FP32Optimizer",
    "bf16_mixed": "bf16 weights, fp32 main parameters in the optimizer state",
    "fp16_mixed": "fp16 weights, fp32 main parameters and a loss scaler in the optimizer state",
}
_DTYPE_PRECISION = {"torch.bfloat16": "bf16_mixed", "torch.float16": "fp16_mixed", "torch.float32": "fp32"}
_NOT_MODEL = ("optimizer.", "rng_state", "rerun_state_machine", "opt_param_scheduler")


class PrecisionMismatchError(CheckpointError):
    """The checkpoint's optimizer state belongs to another precision than the run's (``mixed_precision``)."""


def read_run_config(folder: str | Path) -> dict[str, Any] | None:
    """The ``run_config.yaml`` of a checkpoint folder as a mapping (``yaml.safe_load``: tags that would build
    objects are refused); None when the folder has none or it is not a YAML mapping."""
    path = Path(folder) / RUN_CONFIG_FILENAME
    if not path.is_file():
        return None
    try:
        content = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return content if isinstance(content, dict) else None


def read_model_config(folder: str | Path) -> "ModelConfig":
    """The ``model`` section of a checkpoint's ``run_config.yaml``, as this library's :class:`ModelConfig` (safe YAML
    loader; CheckpointError naming the fix when the folder has none or it is not ours)."""
    from megatron_bridge.config.container import ConfigContainer

    path = Path(folder) / RUN_CONFIG_FILENAME
    if not path.is_file():
        raise CheckpointError(f"{str(path)!r} does not exist: pass the model config explicitly")
    try:
        return ConfigContainer.from_yaml(path).model
    except ValueError as exc:
        raise CheckpointError(f"{str(path)!r} is not a valid run config: {exc}") from exc


def precision_of_flags(bf16: Any, fp16: Any) -> str | None:
    """``optimizer.bf16`` / ``optimizer.fp16`` → the precision name; None unless both are booleans, not both set."""
    if not isinstance(bf16, bool) or not isinstance(fp16, bool) or (bf16 and fp16):
        return None
    return "bf16_mixed" if bf16 else "fp16_mixed" if fp16 else "fp32"


def run_precision(cfg: "ConfigContainer") -> str:
    """The precision of this run's megatron-core optimizer (validated config: ``optimizer.bf16``/``fp16``)."""
    return precision_of_flags(bool(cfg.optimizer.bf16), bool(cfg.optimizer.fp16)) or "fp32"


def precision_from_metadata(metadata: Any) -> str | None:
    """The precision from the dtypes of the model tensors in DCP metadata (a folder without run_config.yaml):
    bf16/fp16 when any model tensor has that dtype, fp32 when all are fp32; None when undecidable."""
    found = set()
    for key, item in getattr(metadata, "state_dict_metadata", {}).items():
        dtype = getattr(getattr(item, "properties", None), "dtype", None)
        if dtype is None or not isinstance(key, str) or key.startswith(_NOT_MODEL) or key.endswith("_extra_state"):
            continue
        found.add(_DTYPE_PRECISION.get(str(dtype)))
    found.discard(None)
    if len(found - {"fp32"}) == 1:
        return (found - {"fp32"}).pop()
    return "fp32" if found == {"fp32"} else None


def saved_precision(folder: str | Path, metadata: Any = None) -> str | None:
    """The precision of the run that wrote ``folder`` (run_config.yaml's ``optimizer.bf16``/``fp16``, else the model
    tensors' dtypes in ``metadata``); None when unknown."""
    config = read_run_config(folder)
    optimizer = config.get("optimizer") if config is not None else None
    if isinstance(optimizer, dict) and "bf16" in optimizer and "fp16" in optimizer:
        return precision_of_flags(optimizer["bf16"], optimizer["fp16"])
    return precision_from_metadata(metadata) if metadata is not None else None


def check_precision(cfg: "ConfigContainer", folder: str | Path, metadata: Any = None) -> None:
    """Refuse to load the optimizer state of a checkpoint saved in another precision than this run's.

    Raises:
        PrecisionMismatchError: both precisions known and different (names them, the folder and the fixes).
    """
    saved, now = saved_precision(folder, metadata), run_precision(cfg)
    if saved is None or saved == now:
        return
    raise PrecisionMismatchError(
        f"checkpoint {str(folder)!r} was saved by a mixed_precision={saved!r} run ({_STATE_OF[saved]}), but this "
        f"run is mixed_precision={now!r} ({_STATE_OF[now]}): the optimizer state of one cannot be loaded into the "
        "other. Fix: set checkpoint.load_optim=False to load the weights and start a fresh optimizer from them "
        f"(main parameters copied from the loaded weights), or set mixed_precision={saved!r} to resume as saved")


ARCHITECTURE_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                       "kv_channels", "vocab_size", "make_vocab_size_divisible_by",
                       "share_embeddings_and_output_weights", "qk_layernorm", "add_bias_linear", "add_qkv_bias",
                       "normalization", "activation", "num_moe_experts")
"""``model`` fields that change parameter shapes or names (ours and Megatron-Bridge's share these names)."""


def model_differences(folder: str | Path, model_cfg: Any) -> list[str]:
    """``model.<field>=<saved> (this run: <value>)`` for each architecture field the folder's run_config.yaml records
    with another value than ``model_cfg`` (empty when it has no run_config.yaml)."""
    config = read_run_config(folder)
    model = config.get("model") if config is not None else None
    if not isinstance(model, dict):
        return []
    out = []
    for field in ARCHITECTURE_FIELDS:
        if field not in model or not hasattr(model_cfg, field):
            continue
        saved, now = model[field], getattr(model_cfg, field)
        if isinstance(saved, bool | int | float | str | None) and saved != now:
            out.append(f"model.{field}={saved!r} (this run: {now!r})")
    return out


def model_mismatch_fix(folder: str | Path, model_cfg: Any = None) -> str:
    """The fix to append to a "does not fit the model" error: the saved run's differing model fields when its
    run_config.yaml records them, else the general advice."""
    differences = model_differences(folder, model_cfg) if model_cfg is not None else []
    if differences:
        return (f". It was saved by another model: {', '.join(differences)}. Fix: set those fields as saved to "
                "resume it, or point checkpoint.load / checkpoint.pretrained_checkpoint at a checkpoint of this model")
    return (". Fix: set the model.* fields the checkpoint was saved with (its run_config.yaml), or point "
            "checkpoint.load / checkpoint.pretrained_checkpoint at a checkpoint of this model")


def optimizer_layout_fix(folder: str | Path, state: dict[str, Any]) -> str:
    """The fix to append to a failed DCP load of the native engine when ``folder`` was written by the other kind of
    backend: Megatron FSDP keys its optimizer state per parameter in nested form (``{"state": {name: ...}}``), DDP and
    FSDP2 flat (``state.<name>.<key>``), so one cannot load the other's (the model weights can). Empty when no
    optimizer state is loaded, the run_config.yaml does not say, or the layouts agree."""
    optimizer = state.get("optimizer")
    config = read_run_config(folder)
    saved = config.get("dist") if config is not None else None
    if not isinstance(optimizer, dict) or not isinstance(saved, dict) or not isinstance(
            saved.get("use_megatron_fsdp"), bool):
        return ""
    written_by_mfsdp, loading_nested = saved["use_megatron_fsdp"], isinstance(optimizer.get("state"), dict)
    if written_by_mfsdp == loading_nested:
        return ""
    writer = "Megatron FSDP (dist.use_megatron_fsdp=True)" if written_by_mfsdp else "DDP or FSDP2"
    return (f". The checkpoint was written by {writer}, whose optimizer state is keyed differently from this "
            "backend's. Fix: set checkpoint.load_optim=False to load its model weights with a fresh optimizer, or "
            f"resume it with dist.use_megatron_fsdp={written_by_mfsdp}")
