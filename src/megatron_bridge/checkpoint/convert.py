"""Full-weight import and export: checkpoint folders ↔ one ``torch`` file ↔ a Hugging Face Llama folder.

Everything here works in one process without a model instance; ``scripts/checkpoint/convert.py`` is the CLI.

* :func:`read_model_weights` reads the model weights (full tensors, our parameter names) from any source: a
  checkpoint root (its latest step), an ``iter_NNNNNNN`` folder of any format, a weights file written by
  :func:`write_torch_weights`, or a Hugging Face folder.
* :func:`write_torch_weights` writes ``{"model": {name: tensor}}`` (loads with ``torch.load(weights_only=True)``).
* :func:`write_hf_folder` writes ``model.safetensors`` + ``config.json`` with HF Llama names
  (``model.embed_tokens.weight``, ``model.layers.N.self_attn.q_proj.weight``, ..., ``lm_head.weight``), the padded
  vocabulary rows cut back to ``vocab_size``. :func:`read_hf_folder` does the reverse; loading into a model pads
  the vocabulary rows with zeros to its ``padded_vocab_size`` (:func:`pad_vocab`).
"""

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from megatron_bridge.checkpoint import layout
from megatron_bridge.checkpoint.reader import (
    DCP_ERRORS,
    SafeFileSystemReader,
    SafeLoadPlanner,
    check_dcp_storage,
    dcp_error_message,
    load_torch_file,
    read_dcp_metadata,
)
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import CheckpointError


HF_WEIGHTS_FILENAME = "model.safetensors"
HF_CONFIG_FILENAME = "config.json"
VOCAB_KEYS = ("embed_tokens.weight", "lm_head.weight")
"""Our parameters whose rows are the (padded) vocabulary."""
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


# ------------------------------------------------------------------------------------------------- detection
def is_hf_folder(path: str | Path) -> bool:
    """True for a folder with ``config.json`` and ``model.safetensors``."""
    path = Path(path)
    return (path / HF_CONFIG_FILENAME).is_file() and (path / HF_WEIGHTS_FILENAME).is_file()


def resolve_checkpoint_folder(path: str | Path, step: int | None = None) -> Path:
    """The ``iter_NNNNNNN`` folder meant by ``path``: itself, or (for a checkpoint root) ``step`` or the latest."""
    path = Path(path)
    if layout.step_of(path) is not None or (path / layout.MANIFEST_FILENAME).is_file():
        return path
    if step is None:
        step = layout.read_tracker_step(path)
    if step is None:
        steps = layout.list_checkpoints(path)
        if not steps:
            raise CheckpointError(f"{str(path)!r} holds no checkpoint (no tracker file and no iter_* folder)")
        step = steps[-1]
    folder = layout.iteration_dir(path, step)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {str(folder)!r} does not exist")
    return folder


# -------------------------------------------------------------------------------------------------- reading
def read_model_weights(path: str | Path, *, step: int | None = None) -> dict[str, torch.Tensor]:
    """Full model weights (our names) from a checkpoint, a weights file or a HF folder (see module docstring)."""
    path = Path(path)
    if path.is_file():
        return _weights_from_file(path)
    if is_hf_folder(path):
        return read_hf_folder(path)
    folder = resolve_checkpoint_folder(path, step)
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
def to_hf_name(name: str) -> str:
    """Our parameter name → HF Llama name (``lm_head.weight`` stays, everything else gets ``model.``)."""
    return name if name.startswith("lm_head.") else f"model.{name}"


def from_hf_name(name: str) -> str:
    """HF Llama name → our parameter name."""
    return name[len("model.") :] if name.startswith("model.") else name


def hf_config(config: ModelConfig, dtype: torch.dtype) -> dict[str, Any]:
    """A ``LlamaForCausalLM`` config.json dict for ``config``; CheckpointError for non-Llama architectures."""
    if config.normalization != "RMSNorm" or config.activation != "swiglu" or config.qk_layernorm:
        raise CheckpointError(
            "HF export supports the Llama architecture only (RMSNorm, SwiGLU, no qk_layernorm); got "
            f"normalization={config.normalization!r}, activation={config.activation!r}, "
            f"qk_layernorm={config.qk_layernorm}"
        )
    out: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.ffn_hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.seq_length,
        "rms_norm_eps": config.layernorm_epsilon,
        "rope_theta": config.rotary_base,
        "tie_word_embeddings": config.share_embeddings_and_output_weights,
        "attention_bias": config.add_qkv_bias,
        "mlp_bias": config.add_bias_linear,
        "hidden_act": "silu",
        "torch_dtype": _DTYPE_NAMES.get(dtype, "float32"),
    }
    if config.rope_scaling:
        out["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": config.rope_scaling_factor,
            "low_freq_factor": config.rope_low_freq_factor,
            "high_freq_factor": config.rope_high_freq_factor,
            "original_max_position_embeddings": config.rope_original_max_position_embeddings,
        }
    return out


def model_config_from_hf(hf: dict[str, Any], **overrides: Any) -> ModelConfig:
    """A :class:`ModelConfig` for a HF Llama ``config.json`` dict (``overrides`` win)."""
    try:
        fields: dict[str, Any] = {
            "num_layers": int(hf["num_hidden_layers"]),
            "hidden_size": int(hf["hidden_size"]),
            "ffn_hidden_size": int(hf["intermediate_size"]),
            "num_attention_heads": int(hf["num_attention_heads"]),
            "num_query_groups": int(hf.get("num_key_value_heads") or hf["num_attention_heads"]),
            "vocab_size": int(hf["vocab_size"]),
            "seq_length": int(hf.get("max_position_embeddings", 2048)),
            "layernorm_epsilon": float(hf.get("rms_norm_eps", 1e-5)),
            "rotary_base": float(hf.get("rope_theta", 10000.0)),
            "share_embeddings_and_output_weights": bool(hf.get("tie_word_embeddings", False)),
            "add_qkv_bias": bool(hf.get("attention_bias", False)),
            "add_bias_linear": bool(hf.get("mlp_bias", False)),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"HF config.json lacks or has a bad Llama field: {exc}") from exc
    if hf.get("head_dim"):
        fields["kv_channels"] = int(hf["head_dim"])
    return ModelConfig(**{**fields, **overrides})


def write_hf_folder(weights: dict[str, torch.Tensor], config: ModelConfig, out_dir: str | Path) -> Path:
    """Write ``model.safetensors`` (HF names, vocabulary unpadded to ``config.vocab_size``) and ``config.json``."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in weights.items():
        if name in VOCAB_KEYS:
            tensor = tensor[: config.vocab_size]
        tensors[to_hf_name(name)] = tensor.detach().cpu().contiguous()
    dtype = next(iter(weights.values())).dtype
    save_file(tensors, str(out_dir / HF_WEIGHTS_FILENAME), metadata={"format": "pt"})
    (out_dir / HF_CONFIG_FILENAME).write_text(json.dumps(hf_config(config, dtype), indent=2) + "\n")
    return out_dir


def read_hf_config(folder: str | Path) -> dict[str, Any]:
    """Parse a HF folder's ``config.json``."""
    path = Path(folder) / HF_CONFIG_FILENAME
    try:
        content = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{str(path)!r} is missing or not JSON: {exc}") from exc
    if not isinstance(content, dict):
        raise CheckpointError(f"{str(path)!r} is not a JSON object")
    return content


def read_hf_folder(folder: str | Path, padded_vocab_size: int | None = None) -> dict[str, torch.Tensor]:
    """Weights of a HF Llama folder under our names; vocabulary rows zero-padded to ``padded_vocab_size`` when
    given (None keeps the HF rows)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        tensors = load_file(str(folder / HF_WEIGHTS_FILENAME))
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"{str(folder / HF_WEIGHTS_FILENAME)!r} is unreadable: {exc}") from exc
    weights = {from_hf_name(name): tensor for name, tensor in tensors.items()}
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


def convert_weights(src: str | Path, dst: str | Path, to: str, *, step: int | None = None,
            model_config: ModelConfig | None = None) -> Path:
    """Convert ``src`` (any source :func:`read_model_weights` accepts) to ``to`` = "torch" (a file) or "hf" (a
    folder). HF export needs the model config: ``model_config``, else the checkpoint's run_config.yaml."""
    weights = read_model_weights(src, step=step)
    if to == "torch":
        return write_torch_weights(weights, dst)
    if to == "hf":
        if model_config is None:
            src_path = Path(src)
            if src_path.is_file() or is_hf_folder(src_path):
                raise CheckpointError("HF export of a weights file needs the model config (--config run_config.yaml)")
            model_config = read_model_config(resolve_checkpoint_folder(src_path, step))
        return write_hf_folder(weights, model_config, dst)
    raise CheckpointError(f"unknown conversion target {to!r}: use 'torch' or 'hf'")
