"""Weights between the two engines: a native state dict of the shared decoder ↔ a megatron-core ``GPTModel`` state
dict (local layer spec, full tensors as with TP=1). Pure tensor reshuffling; megatron-core is not imported.

The map is one declarative table, :func:`weight_rules` (``(native patterns, megatron-core pattern, fusion)``, ``*``
standing for the layer index), built from the shared decoder's names (:mod:`megatron_bridge.config.decoder_names`):
the embedding, the final norm and the untied output layer; per layer its two norms (megatron-core's
``input_layernorm`` and ``pre_mlp_layernorm``), the attention's fused ``linear_qkv`` (per query group, its query heads,
then its key head, then its value head), its ``linear_proj`` and per-head ``q_layernorm``/``k_layernorm``, the MLP's
``linear_fc1`` (gate rows, then up rows; the up projection alone without a gate, GELU) and ``linear_fc2``. Weights and
biases alike.

The same names and layouts as Megatron-Bridge's Llama/Qwen3 mappings to megatron-core (fused QKV grouped per query
group, fused gate/up ``linear_fc1``).

Under pipeline parallelism a stage's ``GPTModel`` numbers its decoder layers from 0:
:func:`megatron_core_stage_state` cuts a stage's state dict out of a whole-model one, :func:`megatron_core_merge_stages`
puts the stages back together (the global layer indices of a stage: its layers' ``layer_number - 1``, or
:func:`megatron_bridge.config.pipeline_layout.build_stage_specs`).
"""

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from megatron_bridge.config import decoder_names as n


if TYPE_CHECKING:
    from megatron_bridge.config.model import ModelConfig

Fusion = Literal["qkv", "concat"] | None


@dataclass(frozen=True)
class WeightRule:
    """Native tensors ``native`` (patterns, ``*`` the layer index) are the megatron-core tensor ``mcore``: the one
    tensor itself (``fusion`` None), their concatenation along dim 0 (``"concat"``), or the QKV fusion grouped per
    query group (``"qkv"``)."""

    native: tuple[str, ...]
    mcore: str
    fusion: Fusion = None


def _layer_rules(gated: bool) -> list[WeightRule]:
    attn, mlp, mc = f"{n.ATTENTION}.", f"{n.MLP}.", "decoder.layers.*."
    rules = []
    for kind in ("weight", "bias"):
        fc1 = (n.GATE, n.UP) if gated else (n.UP,)
        rules += [
            WeightRule((f"{n.ATTENTION_NORM}.{kind}",), f"{mc}input_layernorm.{kind}"),
            WeightRule((f"{n.MLP_NORM}.{kind}",), f"{mc}pre_mlp_layernorm.{kind}"),
            WeightRule(tuple(f"{attn}{p}.{kind}" for p in n.QKV), f"{mc}self_attention.linear_qkv.{kind}", "qkv"),
            WeightRule((f"{attn}{n.O_PROJ}.{kind}",), f"{mc}self_attention.linear_proj.{kind}"),
            WeightRule(tuple(f"{mlp}{p}.{kind}" for p in fc1), f"{mc}mlp.linear_fc1.{kind}",
                       "concat" if gated else None),
            WeightRule((f"{mlp}{n.DOWN}.{kind}",), f"{mc}mlp.linear_fc2.{kind}"),
        ]
    rules += [WeightRule((f"{attn}{head_norm}.weight",), f"{mc}self_attention.{theirs}.weight")
              for head_norm, theirs in zip(n.HEAD_NORMS, ("q_layernorm", "k_layernorm"), strict=True)]
    shared = f"{mlp}{n.SHARED_EXPERTS}."
    rules += [
        WeightRule((f"{mlp}{n.ROUTER}.weight",), f"{mc}mlp.router.weight"),
        WeightRule((f"{mlp}{n.ROUTER}.expert_bias",), f"{mc}mlp.router.expert_bias"),
        WeightRule((f"{shared}{n.GATE}.weight", f"{shared}{n.UP}.weight"), f"{mc}mlp.shared_experts.linear_fc1.weight",
                   "concat"),
        WeightRule((f"{shared}{n.DOWN}.weight",), f"{mc}mlp.shared_experts.linear_fc2.weight"),
    ]
    return [WeightRule(tuple(f"{n.layer('*')}.{p}" for p in r.native), r.mcore, r.fusion) for r in rules]


def weight_rules(model: "ModelConfig") -> list[WeightRule]:
    """The native ↔ megatron-core table for ``model`` (the MLP's ``linear_fc1`` depends on its activation)."""
    top = [
        WeightRule((f"{n.EMBEDDING}.weight",), "embedding.word_embeddings.weight"),
        WeightRule((f"{n.FINAL_NORM}.weight",), "decoder.final_layernorm.weight"),
        WeightRule((f"{n.FINAL_NORM}.bias",), "decoder.final_layernorm.bias"),
        WeightRule((f"{n.OUTPUT}.weight",), "output_layer.weight"),
    ]
    return top + _layer_rules(model.gated_linear_unit)


def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(re.escape(pattern).replace(r"\*", r"(\d+)") + "$")


def _fill(pattern: str, groups: tuple[str, ...]) -> str:
    return pattern.replace("*", groups[0]) if groups else pattern


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


def _join(rule: WeightRule, tensors: list[torch.Tensor], model: "ModelConfig") -> torch.Tensor:
    if rule.fusion == "qkv":
        return _fuse_qkv(*tensors, model)
    return torch.cat(tensors) if rule.fusion == "concat" else tensors[0]


def _split(rule: WeightRule, tensor: torch.Tensor, model: "ModelConfig") -> Sequence[torch.Tensor]:
    if rule.fusion == "qkv":
        return _split_qkv(tensor, model)
    return torch.chunk(tensor, len(rule.native), dim=0) if rule.fusion == "concat" else (tensor,)


_NATIVE_EXPERTS = re.compile(rf"{re.escape(n.LAYERS)}\.(\d+)\.{re.escape(n.MLP)}\.{re.escape(n.EXPERTS)}\.{n.GATE}$")
_MCORE_EXPERT = re.compile(r"decoder\.layers\.(\d+)\.mlp\.experts\.local_experts\.(\d+)\.linear_fc1\.weight$")


def _experts_to_megatron_core(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The routed experts: native stacked ``gate/up [E, hidden, F]`` and ``down [E, F, hidden]`` (``x @ W``) →
    megatron-core's ``SequentialMLP`` ``local_experts.e.linear_fc1.weight [2F, hidden]`` (gate rows, then up rows)
    and ``linear_fc2.weight [hidden, F]`` per expert (``x @ W.T``)."""
    out = {}
    for key in state:
        match = _NATIVE_EXPERTS.match(key)
        if not match:
            continue
        prefix = key[: -len(n.GATE)]
        gate, up, down = (state[prefix + w] for w in n.EXPERT_WEIGHTS)
        mc = f"decoder.layers.{match.group(1)}.mlp.experts.local_experts"
        for e in range(gate.shape[0]):
            out[f"{mc}.{e}.linear_fc1.weight"] = torch.cat([gate[e].t(), up[e].t()]).contiguous()
            out[f"{mc}.{e}.linear_fc2.weight"] = down[e].t().contiguous()
    return out


def _experts_to_native(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`_experts_to_megatron_core` (every expert of a layer must be in ``state``)."""
    experts: dict[int, dict[int, str]] = {}
    for key in state:
        match = _MCORE_EXPERT.match(key)
        if match:
            experts.setdefault(int(match.group(1)), {})[int(match.group(2))] = key[: -len("linear_fc1.weight")]
    out = {}
    for layer, by_expert in experts.items():
        prefixes = [by_expert[e] for e in range(len(by_expert))]
        fc1 = [state[p + "linear_fc1.weight"] for p in prefixes]
        gate = torch.stack([w[: w.shape[0] // 2].t() for w in fc1])
        up = torch.stack([w[w.shape[0] // 2 :].t() for w in fc1])
        down = torch.stack([state[p + "linear_fc2.weight"].t() for p in prefixes])
        native = f"{n.mlp(layer)}.{n.EXPERTS}."
        out.update({native + w: t.contiguous() for w, t in zip(n.EXPERT_WEIGHTS, (gate, up, down), strict=True)})
    return out


def native_to_megatron_core(state: dict[str, torch.Tensor], model: "ModelConfig") -> dict[str, torch.Tensor]:
    """A megatron-core ``GPTModel`` state dict (full tensors) from a native state dict (:func:`weight_rules`; a fused
    tensor is keyed on its last native part, the others must be there too; the routed experts of MoE layers by
    :func:`_experts_to_megatron_core`)."""
    out = _experts_to_megatron_core(state)
    for rule in weight_rules(model):
        lead = _regex(rule.native[-1])
        for key in state:
            match = lead.match(key)
            if match:
                parts = [state[_fill(p, match.groups())] for p in rule.native]
                out[_fill(rule.mcore, match.groups())] = _join(rule, parts, model)
    return out


def megatron_core_to_native(state: dict[str, torch.Tensor], model: "ModelConfig") -> dict[str, torch.Tensor]:
    """A native state dict from a megatron-core ``GPTModel`` state dict (full tensors, :func:`weight_rules`);
    megatron-core's ``_extra_state`` entries are dropped."""
    out = _experts_to_native(state)
    for rule in weight_rules(model):
        pattern = _regex(rule.mcore)
        for key, value in state.items():
            match = pattern.match(key)
            if match:
                for name, part in zip(rule.native, _split(rule, value, model), strict=True):
                    out[_fill(name, match.groups())] = part
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
