"""Weights between the two engines: a native ``LlamaModel`` state dict ↔ a megatron-core ``GPTModel`` state dict
(local layer spec, full tensors as with TP=1). Pure tensor reshuffling; megatron-core is not imported.

==============================================  =====================================================================
native                                          megatron-core
==============================================  =====================================================================
embed_tokens.weight                             embedding.word_embeddings.weight
layers.i.input_layernorm.weight                 decoder.layers.i.input_layernorm.weight
layers.i.self_attn.{q,k,v}_proj.{weight,bias}   decoder.layers.i.self_attention.linear_qkv.{weight,bias}: per query
                                                group, its query heads, then its key head, then its value head
layers.i.self_attn.o_proj.{weight,bias}         decoder.layers.i.self_attention.linear_proj.{weight,bias}
layers.i.self_attn.{q,k}_norm.weight            decoder.layers.i.self_attention.{q,k}_layernorm.weight
layers.i.post_attention_layernorm.weight        decoder.layers.i.pre_mlp_layernorm.weight
layers.i.mlp.{gate,up}_proj.{weight,bias}       decoder.layers.i.mlp.linear_fc1.{weight,bias}: gate rows, then up rows
layers.i.mlp.down_proj.{weight,bias}            decoder.layers.i.mlp.linear_fc2.{weight,bias}
norm.weight                                     decoder.final_layernorm.weight
lm_head.weight (untied only)                    output_layer.weight
==============================================  =====================================================================

LayerNorm biases follow their weights. The same names and layouts as Megatron-Bridge's Llama/Qwen3 mappings to
megatron-core (fused QKV grouped per query group, fused gate/up ``linear_fc1``). With the GELU MLP (no gate)
``linear_fc1`` is ``up_proj`` alone.

Under pipeline parallelism a stage's ``GPTModel`` numbers its decoder layers from 0:
:func:`megatron_core_stage_state` cuts a stage's state dict out of a whole-model one, :func:`megatron_core_merge_stages`
puts the stages back together (the global layer indices of a stage: its layers' ``layer_number - 1``, or
:func:`megatron_bridge.config.pipeline_layout.build_stage_specs`).
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch


if TYPE_CHECKING:
    from megatron_bridge.config.model import ModelConfig

_DIRECT = {
    "input_layernorm.weight": "input_layernorm.weight",
    "input_layernorm.bias": "input_layernorm.bias",
    "post_attention_layernorm.bias": "pre_mlp_layernorm.bias",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "self_attn.o_proj.bias": "self_attention.linear_proj.bias",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
    "mlp.down_proj.bias": "mlp.linear_fc2.bias",
}
_TOP = {"embed_tokens.weight": "embedding.word_embeddings.weight", "norm.weight": "decoder.final_layernorm.weight",
        "norm.bias": "decoder.final_layernorm.bias", "lm_head.weight": "output_layer.weight"}


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, model: "ModelConfig") -> torch.Tensor:
    groups, d = model.num_kv_heads, model.head_dim
    per_group = model.num_attention_heads // groups
    q = q.reshape(groups, per_group * d, *q.shape[1:])
    k = k.reshape(groups, d, *k.shape[1:])
    v = v.reshape(groups, d, *v.shape[1:])
    return torch.cat([q, k, v], dim=1).reshape(-1, *q.shape[2:])


def _split_qkv(qkv: torch.Tensor, model: "ModelConfig") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, d = model.num_kv_heads, model.head_dim
    per_group = model.num_attention_heads // groups
    grouped = qkv.reshape(groups, (per_group + 2) * d, *qkv.shape[1:])
    q, k, v = torch.split(grouped, [per_group * d, d, d], dim=1)
    return (q.reshape(-1, *qkv.shape[1:]), k.reshape(-1, *qkv.shape[1:]), v.reshape(-1, *qkv.shape[1:]))


def native_to_megatron_core(state: dict[str, torch.Tensor], model: "ModelConfig") -> dict[str, torch.Tensor]:
    """A megatron-core ``GPTModel`` state dict (full tensors) from a native ``LlamaModel`` state dict."""
    out = {_TOP[k]: v for k, v in state.items() if k in _TOP}
    gated = model.activation == "swiglu"
    for i in range(model.num_layers):
        src, dst = f"layers.{i}.", f"decoder.layers.{i}."
        for a, b in _DIRECT.items():
            if src + a in state:
                out[dst + b] = state[src + a]
        for kind in ("weight", "bias"):
            q = state.get(f"{src}self_attn.q_proj.{kind}")
            if q is not None:
                out[f"{dst}self_attention.linear_qkv.{kind}"] = _fuse_qkv(
                    q, state[f"{src}self_attn.k_proj.{kind}"], state[f"{src}self_attn.v_proj.{kind}"], model)
            up = state.get(f"{src}mlp.up_proj.{kind}")
            if up is not None:
                fc1 = torch.cat([state[f"{src}mlp.gate_proj.{kind}"], up]) if gated else up
                out[f"{dst}mlp.linear_fc1.{kind}"] = fc1
    return out


def megatron_core_to_native(state: dict[str, torch.Tensor], model: "ModelConfig") -> dict[str, torch.Tensor]:
    """A native ``LlamaModel`` state dict from a megatron-core ``GPTModel`` state dict (full tensors); megatron-core's
    ``_extra_state`` entries are dropped."""
    back = {v: k for k, v in _TOP.items()}
    out = {back[k]: v for k, v in state.items() if k in back}
    gated = model.activation == "swiglu"
    for i in range(model.num_layers):
        src, dst = f"decoder.layers.{i}.", f"layers.{i}."
        for a, b in _DIRECT.items():
            if src + b in state:
                out[dst + a] = state[src + b]
        for kind in ("weight", "bias"):
            qkv = state.get(f"{src}self_attention.linear_qkv.{kind}")
            if qkv is not None:
                q, k, v = _split_qkv(qkv, model)
                out.update({f"{dst}self_attn.q_proj.{kind}": q, f"{dst}self_attn.k_proj.{kind}": k,
                            f"{dst}self_attn.v_proj.{kind}": v})
            fc1 = state.get(f"{src}mlp.linear_fc1.{kind}")
            if fc1 is not None:
                if gated:
                    gate, up = torch.chunk(fc1, 2, dim=0)
                    out[f"{dst}mlp.gate_proj.{kind}"] = gate
                    out[f"{dst}mlp.up_proj.{kind}"] = up
                else:
                    out[f"{dst}mlp.up_proj.{kind}"] = fc1
    return out


_PRE_PROCESS = ("embedding.",)
_POST_PROCESS = ("decoder.final_layernorm.", "output_layer.")


def megatron_core_stage_state(state: dict[str, torch.Tensor], layers: Sequence[int], *, pre_process: bool,
                              post_process: bool, tied: bool = False) -> dict[str, torch.Tensor]:
    """The state dict of one pipeline stage's ``GPTModel`` from a whole-model megatron-core state dict: global decoder
    layers ``layers`` renumbered from 0 (megatron-core numbers a stage's layers locally; its ``layer_number`` is
    global, 1-based), the embedding with ``pre_process``, the final norm and output layer with ``post_process``.
    With ``tied`` embeddings a last stage without the embedding gets it as its ``output_layer.weight`` (megatron-core's
    copy of the shared weight there)."""
    out: dict[str, torch.Tensor] = {}
    for local, layer in enumerate(layers):
        prefix = f"decoder.layers.{layer}."
        out.update({f"decoder.layers.{local}.{k[len(prefix):]}": v for k, v in state.items() if k.startswith(prefix)})
    for keep, prefixes in ((pre_process, _PRE_PROCESS), (post_process, _POST_PROCESS)):
        if keep:
            out.update({k: v for k, v in state.items() if k.startswith(prefixes)})
    if tied and post_process and not pre_process:
        out["output_layer.weight"] = state["embedding.word_embeddings.weight"]
    return out


def megatron_core_merge_stages(stages: Sequence[tuple[dict[str, torch.Tensor], Sequence[int]]], *,
                               tied: bool = False) -> dict[str, torch.Tensor]:
    """A whole-model megatron-core state dict from the stages' ``(state dict, global layers)`` pairs (the inverse of
    :func:`megatron_core_stage_state`); with ``tied`` embeddings the last stage's copy (``output_layer.weight``) is
    dropped, as a one-stage tied model has none."""
    out: dict[str, torch.Tensor] = {}
    for state, layers in stages:
        for key, value in state.items():
            if tied and key == "output_layer.weight":
                continue
            if key.startswith("decoder.layers."):
                local, rest = key[len("decoder.layers."):].split(".", 1)
                key = f"decoder.layers.{layers[int(local)]}.{rest}"
            out[key] = value
    return out
