"""Pipeline stages as pruned copies of the full :class:`~megatron_bridge.models.llama.LlamaModel`.

A stage module is a ``LlamaModel`` that keeps only what its :class:`~megatron_bridge.config.pipeline_layout.StageSpec`
holds: the embedding (first stage), its decoder layers in an ``nn.ModuleDict`` keyed by *global* layer index, and the
final norm with the output layer (last stage). Parameter names are therefore those of the full model
(``layers.5.mlp.up_proj.weight`` on whichever stage holds layer 5): checkpoints load at any PP/VPP layout and
compare with a PP=1 run key by key.

Tied embeddings (``model.share_embeddings_and_output_weights``): the last stage keeps an ``embed_tokens`` of its own
as its output weight, as Megatron does: a copy of the first stage's embedding (``embeds_input`` is False there, so
its input stays hidden states), under the same name ``embed_tokens.weight``, kept equal to the first stage's by
:class:`~megatron_bridge.distributed.tied_embeddings.TiedEmbeddings` (gradients summed over the two stages).

Initialization: built on a real device, the full model is built first (same random draws as PP=1, so the weights
are bitwise those of a PP=1 run with the same seed) and each stage takes its modules from it. With
``model.init_model_with_meta_device`` only the stage's modules exist (on the meta device) and the data-parallel
backend initializes them after sharding: memory stays per stage, but the values differ from a PP=1 build (as in
Megatron, where each pipeline rank seeds its own initialization).
"""

import copy

import torch
from torch import nn

from megatron_bridge.config.model import ModelConfig, resolve_schedule
from megatron_bridge.config.pipeline_layout import StageSpec, build_stage_specs
from megatron_bridge.models.layers import RotaryEmbedding
from megatron_bridge.models.llama import LlamaModel
from megatron_bridge.utils.logging import get_logger, log_rank_0


logger = get_logger(__name__)

_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def prune_to_stage(model: LlamaModel, spec: StageSpec) -> LlamaModel:
    """Drop from ``model`` (in place) everything stage ``spec`` does not hold; returns ``model``."""
    layers = model.decoder_layers()
    model.layers = nn.ModuleDict({str(i): layers[i] for i in spec.layers})
    if not spec.is_first and not (spec.is_last and model.config.share_embeddings_and_output_weights):
        model.embed_tokens = None
    model.embeds_input = spec.is_first
    if not spec.is_last:
        model.norm = None
        model.lm_head = None
        dtype = model.config.pipeline_dtype
        model.stage_output_dtype = _DTYPES[dtype] if dtype is not None else None
    model.pipeline_stage = spec
    return model


def _take_from(stage: LlamaModel, full: LlamaModel, spec: StageSpec, device: torch.device | str | None) -> None:
    """Put ``full``'s modules (initialized, on ``device``) into the meta-device ``stage`` (no copy)."""
    full_layers = full.decoder_layers()
    for i in spec.layers:
        stage.layers[str(i)] = full_layers[i]
    if spec.is_first:
        stage.embed_tokens = full.embed_tokens
    elif spec.is_last and stage.embed_tokens is not None:  # tied: the last stage's own copy of the embedding
        stage.embed_tokens = copy.deepcopy(full.embed_tokens)
    if spec.is_last:
        stage.norm = full.norm
        stage.lm_head = full.lm_head
    stage.rotary_emb = RotaryEmbedding(stage.config, device=device)


def build_pipeline_chunks(config: ModelConfig, pp_rank: int, *, device: torch.device | str | None = None
                          ) -> list[LlamaModel]:
    """The stage modules (model chunks) pipeline rank ``pp_rank`` holds, in increasing stage order.

    Raises:
        PipelineLayoutError: the pipeline fields of ``config`` cannot split the model.
    """
    all_specs = build_stage_specs(config)
    tied = config.share_embeddings_and_output_weights
    log_rank_0(logger, "pipeline layout (%s): %s", resolve_schedule(config),
               "; ".join(describe(spec, tied=tied) for spec in all_specs))
    full = None if config.init_model_with_meta_device else LlamaModel(config, device=device)
    chunks = []
    for spec in (s for s in all_specs if s.rank == pp_rank):
        stage = prune_to_stage(LlamaModel(config, device="meta"), spec)
        if full is not None:
            _take_from(stage, full, spec, device)
        chunks.append(stage)
    return chunks


def describe(spec: StageSpec, *, tied: bool = False) -> str:
    """``"stage 0 (rank 0): embedding + layers 0-3"``; with ``tied`` the last stage's output layer is named a copy of
    the embedding."""
    parts = ["embedding"] if spec.is_first else []
    if spec.layers:
        parts.append(f"layers {spec.layers[0]}-{spec.layers[-1]}")
    if spec.is_last:
        parts.append("output layer (tied: a copy of the embedding) + loss" if tied and not spec.is_first
                     else "output layer + loss")
    return f"stage {spec.index} (rank {spec.rank}): {' + '.join(parts)}"
