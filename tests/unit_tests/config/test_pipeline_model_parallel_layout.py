"""``model.pipeline_model_parallel_layout`` (config/pipeline_layout.py): both of megatron-core's forms, the stages
they give, and the errors that name the stage."""

import pytest

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.config.pipeline_layout import PipelineLayoutError, build_stage_specs, parse_layout


LLAMA3_70B_H100_FP8 = "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"
"""Megatron-Bridge's llama3_70b_pretrain_64gpu_h100_fp8cs_config layout (PP 8 × VP 5)."""


def _model(layout: object, num_layers: int = 4, pp: int = 2, vp: int | None = 2, **fields: object) -> ModelConfig:
    return ModelConfig(num_layers=num_layers, pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vp,
                       pipeline_model_parallel_layout=layout, **fields)  # type: ignore[arg-type]


def test_string_form_unrolls_repeats_and_ignores_commas() -> None:
    assert parse_layout("Et|(tt|)*2,tL") == [("embedding", "decoder"), ("decoder",) * 2, ("decoder",) * 2,
                                              ("decoder", "loss")]
    assert parse_layout("E|t*3|m|L") == [("embedding",), ("decoder",) * 3, ("mtp",), ("loss",)]
    stages = parse_layout(LLAMA3_70B_H100_FP8)
    assert len(stages) == 40 and sum(s.count("decoder") for s in stages) == 80
    assert [s.count("decoder") for s in stages[-5:]] == [3, 2, 2, 2, 1]


def test_list_form_matches_the_string_form_case_and_spaces_ignored() -> None:
    listed = [["embedding"], ["decoder"] * 2, [" Decoder", "DECODER "], ["loss"]]
    assert parse_layout(listed) == parse_layout("E|tt|tt|L")
    assert parse_layout((("embedding", "decoder", "loss"),)) == [("embedding", "decoder", "loss")]


def test_matches_megatron_core_parser() -> None:
    layout = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    for text in (LLAMA3_70B_H100_FP8, "Et|(tt|)*2,tL", "E|t*3|m|L", "(t|)*2,Ett|L"):
        theirs = layout.PipelineParallelLayerLayout.parse_str_to_list(text)
        assert parse_layout(text) == [tuple(t.name for t in stage) for stage in theirs], text


def test_stages_with_only_the_embedding_or_only_the_loss() -> None:
    for layout in ("E|tt|tt|L", [["embedding"], ["decoder"] * 2, ["decoder"] * 2, ["loss"]]):
        specs = build_stage_specs(_model(layout))
        assert [(s.rank, s.layers, s.is_first, s.is_last) for s in specs] == [
            (0, (), True, False), (1, (0, 1), False, False), (0, (2, 3), False, False), (1, (), False, True)]


def test_uneven_layout_without_virtual_stages_and_v_placement() -> None:
    specs = build_stage_specs(_model("Et|tttL", vp=None))
    assert [s.layers for s in specs] == [(0,), (1, 2, 3)]
    v = build_stage_specs(_model("E|tt|t|tL", pipeline_schedule="ZBVZeroBubble"))
    assert [(s.rank, s.layers) for s in v] == [(0, ()), (1, (0, 1)), (1, (2,)), (0, (3,))]


def test_megatron_bridge_70b_layout_splits_80_layers() -> None:
    specs = build_stage_specs(_model(LLAMA3_70B_H100_FP8, num_layers=80, pp=8, vp=5))
    assert [len(s.layers) for s in specs] == [2] * 35 + [3, 2, 2, 2, 1]
    assert specs[35].rank == 3 and specs[-1].rank == 7


@pytest.mark.parametrize(
    ("layout", "fields", "words"),
    [
        ("E|tt|tt", {}, ["has 3 stage(s)", "2 × 2 = 4", "write 4 stages"]),
        ("E|t|t|t|t|t|tL|L", {}, ["has 8 stage(s)", "model.virtual_pipeline_model_parallel_size=4"]),
        ("E|tt|tL|L", {}, ["stage 2 (pipeline rank 0)", "'loss'", "last entry of stage 3"]),
        ("tE|tt|t|L", {}, ["stage 0 (pipeline rank 0)", "'embedding'", "first entry of stage 0"]),
        ("EE|tt|tt|L", {}, ["stage 0 (pipeline rank 0)", "exactly one 'embedding'"]),
        ("t|tt|t|L", {}, ["stage 0 (pipeline rank 0) holds no 'embedding'", "add 'E'"]),
        ("E|tt|tt|t", {"num_layers": 5}, ["stage 3 (pipeline rank 1) holds no 'loss'", "add 'L'"]),
        ("E|tt|tt|mL", {}, ["stage 3 (pipeline rank 1)", "MTP", "no multi-token prediction"]),
        ("E|t|tt|L", {}, ["holds 3 decoder layers", "[0, 1, 2, 0]", "model.num_layers=4"]),
        ("E|ttxt|t|L", {}, ["stage 1", "unknown letter 'x'"]),
        ([["embedding"], ["decoder", "encoder"], ["decoder"] * 2, ["loss"]], {"num_layers": 3},
         ["stage 1", "unknown entry 'encoder'"]),
        ([["embedding"], "decoder", ["loss"], []], {}, ["stage 1 is 'decoder', not a list"]),
        ([["embedding"], [["decoder"]], ["decoder"] * 3, ["loss"]], {}, ["stage 1", "unknown entry ['decoder']"]),
        (4, {}, ["=4 is neither a layout string nor a list of lists"]),
        ("E|tttt||L", {}, ["stage 2 (pipeline rank 0) is empty", "native engine"]),
        ("E|tt|tt|L", {"num_layers_in_first_pipeline_stage": 2}, ["model.num_layers_in_first_pipeline_stage"]),
        ("E|tt|tt|L", {"account_for_loss_in_pipeline_split": True}, ["model.account_for_loss_in_pipeline_split"]),
    ],
)
def test_wrong_layouts_name_the_stage(layout: object, fields: dict, words: list[str]) -> None:
    with pytest.raises(PipelineLayoutError) as info:
        build_stage_specs(_model(layout, **fields))
    assert "model.pipeline_model_parallel_layout" in info.value.paths
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_empty_stage_is_left_to_megatron_core() -> None:
    specs = build_stage_specs(_model("E|tttt||L", engine="megatron_core"))
    assert [s.layers for s in specs] == [(), (0, 1, 2, 3), (), ()]
