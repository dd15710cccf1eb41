"""The model weights of a Megatron FSDP ``fsdp_dtensor`` checkpoint as full tensors under megatron-core's
``GPTModel`` names, read in one process (no process group, no megatron-core): what the native engine converts when
it starts from such a checkpoint (``bridge/cross_engine.py``).

An fsdp_dtensor folder (:mod:`.mcore_megatron_fsdp`) is a PyTorch DCP folder. Its model weights are the DTensors
``model.module.<GPTModel name>``, whose global shapes put every rank's tensor- and data-parallel shards together,
stored in the dtype megatron-fsdp keeps them in (its main weights), after megatron-core's preprocessing
(:mod:`.mcore_megatron_fsdp_preprocess`): each SwiGLU ``linear_fc1.weight`` (and ``.bias``) is split into
``weight_w`` (the gate rows of every TP rank) and ``weight_v`` (their up rows). :func:`read_model_weights` reads each
model tensor whole with DCP (which assembles the shards of every rank, uneven ones too) and undoes the naming:

* the ``model.module.`` prefix is dropped (``_extra_state`` entries are not read);
* ``linear_fc1.weight_w`` / ``weight_v`` become the TP=1 fused ``linear_fc1.weight`` (gate rows, then up rows);
* transformer-engine layer specs fuse the layer norms into the next linear (``linear_qkv.layer_norm_weight``,
  ``linear_fc1.layer_norm_weight``): they get the names megatron-core's local spec gives them
  (``input_layernorm``, ``pre_mlp_layernorm``), which :mod:`megatron_bridge.engines.megatron_core.weights` maps.

Tensors are copied as stored, never recomputed. Optimizer state, scheduler and RNG states are not read. Checkpoints
of several model chunks (``model0``, ...: virtual pipeline stages) and of MoE experts are refused (the megatron-core
engine runs neither under Megatron FSDP: rules ``pipeline_megatron_fsdp``, ``moe_backend``).
"""

import re
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from megatron_bridge.checkpoint.reader import read_dcp_tensors
from megatron_bridge.errors import CheckpointError


MODEL_PREFIX = "model.module."
"""The DCP key prefix of the model weights (``model`` of the state dict, ``MegatronFSDP``'s ``module.`` level)."""
_SWIGLU_HALF = re.compile(r"^(.*\.mlp\.linear_fc1\.(?:weight|bias))_([wv])$")
_CHUNK_KEY = re.compile(r"^model\d+\.")
_TE_NORMS = {
    ".self_attention.linear_qkv.layer_norm_weight": ".input_layernorm.weight",
    ".self_attention.linear_qkv.layer_norm_bias": ".input_layernorm.bias",
    ".mlp.linear_fc1.layer_norm_weight": ".pre_mlp_layernorm.weight",
    ".mlp.linear_fc1.layer_norm_bias": ".pre_mlp_layernorm.bias",
}


def _model_tensors(stored: dict[str, Any], folder: Path) -> dict[str, TensorStorageMetadata]:
    """The DCP metadata of the model weights (module docstring); CheckpointError for what does not convert."""
    chunks = sorted(k for k in stored if _CHUNK_KEY.match(k))
    if chunks:
        raise CheckpointError(f"fsdp_dtensor checkpoint {str(folder)!r} holds several model chunks ({chunks[0]!r}, "
                              "...: virtual pipeline stages), which do not convert to the native engine")
    tensors = {k: v for k, v in stored.items() if k.startswith(MODEL_PREFIX) and isinstance(v, TensorStorageMetadata)
               and not k.endswith("_extra_state")}
    if not tensors:
        raise CheckpointError(f"fsdp_dtensor checkpoint {str(folder)!r} holds no model weights ({MODEL_PREFIX}*)")
    experts = sorted(k for k in tensors if ".mlp.experts." in k or ".mlp.shared_experts." in k)
    if experts:
        raise CheckpointError(f"fsdp_dtensor checkpoint {str(folder)!r} holds MoE expert weights ({experts[0]!r}, "
                              "...), which do not convert to the native engine")
    return tensors


def _gpt_names(loaded: dict[str, torch.Tensor], folder: Path) -> dict[str, torch.Tensor]:
    """``GPTModel`` state dict names and the TP=1 fused SwiGLU ``linear_fc1`` (module docstring)."""
    out: dict[str, torch.Tensor] = {}
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in loaded.items():
        name = key[len(MODEL_PREFIX):]
        match = _SWIGLU_HALF.match(name)
        if match:
            halves.setdefault(match[1], {})[match[2]] = tensor
            continue
        for te_name, local_name in _TE_NORMS.items():
            if name.endswith(te_name):
                name = name[:-len(te_name)] + local_name
        out[name] = tensor
    for name, parts in halves.items():
        if set(parts) != {"w", "v"}:
            raise CheckpointError(f"fsdp_dtensor checkpoint {str(folder)!r} holds only {name}_{''.join(parts)} of "
                                  f"the SwiGLU pair {name}_w / {name}_v")
        if parts["w"].shape != parts["v"].shape:
            raise CheckpointError(f"fsdp_dtensor checkpoint {str(folder)!r} holds SwiGLU halves of different shapes: "
                                  f"{name}_w {list(parts['w'].shape)}, {name}_v {list(parts['v'].shape)}")
        out[name] = torch.cat([parts["w"], parts["v"]], dim=0)
    return out


def read_model_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """Full model weights of the fsdp_dtensor folder ``folder`` under megatron-core's (local spec, TP=1)
    ``GPTModel`` names, in the dtypes stored (module docstring).

    Raises:
        CheckpointError: the folder is incomplete or corrupt, holds no model weights, or holds what does not
            convert (several model chunks, MoE experts, half a SwiGLU pair).
    """
    folder = Path(folder)
    state = read_dcp_tensors(folder, lambda stored: _model_tensors(stored, folder), "fsdp_dtensor checkpoint")
    return _gpt_names(state, folder)
