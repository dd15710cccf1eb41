"""The megatron-core engine splits the layers over pipeline stages exactly as the native engine does.

For every split this library accepts (even, ``num_layers_in_first/last_pipeline_stage``,
``account_for_embedding/loss_in_pipeline_split``; with and without virtual stages), megatron-core's own
``get_num_layers_to_build`` and ``get_transformer_layer_offset`` on the ``TransformerConfig`` the provider builds give
every (pipeline rank, virtual stage) the layers of :func:`megatron_bridge.config.pipeline_layout.build_stage_specs`
(stage ``vp_stage × PP + pp_rank``). Also: the stage cut/merge of megatron-core state dicts round-trips.
"""

import itertools
from dataclasses import replace

import pytest
import torch

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.config.pipeline_layout import PipelineLayoutError, build_stage_specs, parse_layout
from megatron_bridge.engines.megatron_core.weights import megatron_core_merge_stages, megatron_core_stage_state


pytest.importorskip("megatron.core", reason="the megatron-core engine needs megatron-core (Python 3.12)")


def _model(**fields: object) -> ModelConfig:
    fields.setdefault("num_layers", 8)
    return ModelConfig(hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
                       vocab_size=128, seq_length=32, engine="megatron_core", **fields)


def _accepted_splits() -> list[ModelConfig]:
    """Every uneven/even split of 6, 7, 8 or 10 layers at PP 2 and 4, VP None/2/3, that the native layout accepts."""
    out = []
    grid = itertools.product((6, 7, 8, 10), (2, 4), (None, 2, 3), (None, 1, 2, 4), (None, 2), (False, True),
                             (False, True))
    for layers, pp, vp, first, last, emb, loss in grid:
        if (first is not None or last is not None) and (emb or loss):
            continue  # refused by both (tests/unit_tests/config/test_pipeline_layout.py)
        if vp is not None and pp == 2 and first is not None and last is not None:
            continue  # megatron-core divides by zero middle ranks: rule megatron_core_pipeline refuses it
        m = _model(num_layers=layers, pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vp,
                   num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last,
                   account_for_embedding_in_pipeline_split=emb, account_for_loss_in_pipeline_split=loss)
        try:
            build_stage_specs(m)
        except PipelineLayoutError:
            continue
        out.append(m)
    return out


SPLITS = _accepted_splits()


def test_the_grid_covers_every_kind_of_split() -> None:
    kinds = {(m.virtual_pipeline_model_parallel_size is not None, m.num_layers_in_first_pipeline_stage is not None,
              m.num_layers_in_last_pipeline_stage is not None, m.account_for_embedding_in_pipeline_split,
              m.account_for_loss_in_pipeline_split) for m in SPLITS}
    assert len(SPLITS) >= 55 and len(kinds) == 14, (len(SPLITS), sorted(kinds))  # 2 VP × 7 kinds of split


@pytest.mark.parametrize("model", SPLITS, ids=lambda m: (
    f"l{m.num_layers}-pp{m.pipeline_model_parallel_size}-vp{m.virtual_pipeline_model_parallel_size}-"
    f"first{m.num_layers_in_first_pipeline_stage}-last{m.num_layers_in_last_pipeline_stage}-"
    f"emb{int(m.account_for_embedding_in_pipeline_split)}-loss{int(m.account_for_loss_in_pipeline_split)}"))
def test_megatron_core_places_the_layers_of_the_native_split(model: ModelConfig) -> None:
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    from megatron_bridge.engines.megatron_core.provider import transformer_config

    config = transformer_config(model, torch.device("cpu"))
    pp, vp = model.pipeline_model_parallel_size, model.virtual_pipeline_model_parallel_size
    for spec in build_stage_specs(model):
        vp_stage, pp_rank = divmod(spec.index, pp)
        assert spec.rank == pp_rank
        stage = None if vp is None else vp_stage
        built = get_num_layers_to_build(config, vp_stage=stage, pp_rank=pp_rank)
        assert built == len(spec.layers), (spec, built)
        if spec.layers:
            assert get_transformer_layer_offset(config, vp_stage=stage, pp_rank=pp_rank) == spec.layers[0], spec


LAYOUTS = [("E|tt|tt|L", 2), ([["embedding"], ["decoder"] * 4 + ["loss"]], None), ("Et|(t|)*2,ttL", 2),
           ([["Embedding", "decoder"], ["decoder"] * 3, [], ["decoder", "loss"]], 2)]
"""(layout, VP) at PP=2 with 4, 4, 5, 5 decoder layers: embedding-only and loss-only stages, both forms, an empty stage
(megatron-core builds it; the native engine refuses it)."""


@pytest.mark.parametrize(("layout", "vp"), LAYOUTS, ids=range(len(LAYOUTS)))
def test_megatron_core_places_the_layers_of_a_layout(layout: object, vp: int | None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """megatron-core's ``PipelineParallelLayerLayout`` (built by ``TransformerConfig`` from the field) gives every
    (pipeline rank, virtual stage) the layers of build_stage_specs; its own validation accepts the layout."""
    from megatron.core import parallel_state as ps

    from megatron_bridge.engines.megatron_core.provider import transformer_config

    num_layers = sum(stage.count("decoder") for stage in parse_layout(layout))
    model = _model(num_layers=num_layers, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=vp,
                   pipeline_model_parallel_layout=layout)
    theirs = transformer_config(model, torch.device("cpu")).pipeline_model_parallel_layout
    assert theirs.virtual_pipeline_model_parallel_size == (vp or 1)
    # What get_num_layers_to_build and get_transformer_layer_offset ask the layout on this rank (pp_rank given here).
    monkeypatch.setattr(ps, "get_virtual_pipeline_model_parallel_world_size", lambda: vp)
    for spec in build_stage_specs(model):
        vp_stage, pp_rank = divmod(spec.index, 2)
        stage = None if vp is None else vp_stage
        assert theirs.get_num_layers_to_build(vp_stage=stage, pp_rank=pp_rank) == len(spec.layers), spec
        if spec.layers:
            assert theirs.get_layer_offset(vp_stage=stage, pp_rank=pp_rank) == spec.layers[0], spec


def test_transformer_config_carries_the_pipeline_fields() -> None:
    from megatron_bridge.engines.megatron_core.provider import transformer_config

    model = _model(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                   num_layers_in_last_pipeline_stage=2, overlap_p2p_comm=True, batch_p2p_comm=False)
    c = transformer_config(model, torch.device("cpu"))
    assert (c.pipeline_model_parallel_size, c.virtual_pipeline_model_parallel_size) == (2, 2)
    assert (c.num_layers_in_first_pipeline_stage, c.num_layers_in_last_pipeline_stage) == (None, 2)
    assert (c.overlap_p2p_comm, c.batch_p2p_comm) == (True, False)
    assert c.pipeline_dtype == torch.float32
    emb = transformer_config(replace(model, num_layers_in_last_pipeline_stage=None,
                                     virtual_pipeline_model_parallel_size=None,
                                     account_for_embedding_in_pipeline_split=True,
                                     account_for_loss_in_pipeline_split=True), torch.device("cpu"))
    assert emb.account_for_embedding_in_pipeline_split and emb.account_for_loss_in_pipeline_split


def test_stage_state_dicts_round_trip() -> None:
    """Cutting a whole megatron-core state dict into the stages of PP=2 × VP=2 (layers renumbered from 0 per stage,
    embedding first, final norm and output layer last) and merging them back gives it again."""
    model = _model(num_layers=4, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2)
    full = {"embedding.word_embeddings.weight": torch.randn(4, 2), "decoder.final_layernorm.weight": torch.randn(2),
            "output_layer.weight": torch.randn(4, 2)}
    for i in range(4):
        full[f"decoder.layers.{i}.self_attention.linear_qkv.weight"] = torch.randn(3, 2)
        full[f"decoder.layers.{i}.mlp.linear_fc2.weight"] = torch.randn(2, 2)
    specs = build_stage_specs(model)
    stages = [(megatron_core_stage_state(full, s.layers, pre_process=s.is_first, post_process=s.is_last), s.layers)
              for s in specs]
    assert sorted(stages[0][0]) == ["decoder.layers.0.mlp.linear_fc2.weight",
                                    "decoder.layers.0.self_attention.linear_qkv.weight",
                                    "embedding.word_embeddings.weight"]
    assert stages[2][1] == (2,) and torch.equal(stages[2][0]["decoder.layers.0.mlp.linear_fc2.weight"],
                                                full["decoder.layers.2.mlp.linear_fc2.weight"])
    assert "output_layer.weight" in stages[-1][0] and "decoder.final_layernorm.weight" in stages[-1][0]
    merged = megatron_core_merge_stages(stages)
    assert merged.keys() == full.keys() and all(torch.equal(merged[k], full[k]) for k in full)


def test_tied_embedding_copy_on_the_last_stage() -> None:
    """Tied embeddings: the last stage's output layer is a copy of the embedding, dropped again when merging."""
    full = {"embedding.word_embeddings.weight": torch.randn(4, 2), "decoder.final_layernorm.weight": torch.randn(2),
            "decoder.layers.0.mlp.linear_fc2.weight": torch.randn(2, 2),
            "decoder.layers.1.mlp.linear_fc2.weight": torch.randn(2, 2)}
    first = megatron_core_stage_state(full, [0], pre_process=True, post_process=False, tied=True)
    last = megatron_core_stage_state(full, [1], pre_process=False, post_process=True, tied=True)
    assert "output_layer.weight" not in first
    assert torch.equal(last["output_layer.weight"], full["embedding.word_embeddings.weight"])
    assert "output_layer.weight" not in megatron_core_stage_state(full, [0, 1], pre_process=True, post_process=True,
                                                                   tied=True)
    merged = megatron_core_merge_stages([(first, [0]), (last, [1])], tied=True)
    assert merged.keys() == full.keys()
