"""The pipeline split (config/pipeline_layout.py): layer counts, placement, and the errors that name the fields."""

import pytest

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.config.pipeline_layout import (
    PipelineLayoutError,
    build_stage_specs,
    rank_of_stage,
    stage_layer_counts,
    stages_of_rank,
)
from megatron_bridge.recipes import llama3_70b_pretrain_config, llama31_405b_pretrain_config, qwen3_32b_pretrain_config


def _model(num_layers: int, pp: int, vp: int | None = None, **fields: object) -> ModelConfig:
    return ModelConfig(num_layers=num_layers, pipeline_model_parallel_size=pp,
                       virtual_pipeline_model_parallel_size=vp, **fields)  # type: ignore[arg-type]


def test_even_split_and_loop_placement() -> None:
    m = _model(8, 2, 2)
    assert stage_layer_counts(m) == [2, 2, 2, 2]
    specs = build_stage_specs(m)
    assert [s.rank for s in specs] == [0, 1, 0, 1]
    assert [s.layers for s in stages_of_rank(m, 1)] == [(2, 3), (6, 7)]
    assert specs[0].is_first and specs[-1].is_last and not specs[1].is_first


def test_v_placement_puts_first_and_last_stage_on_rank_0() -> None:
    assert [rank_of_stage(s, 4, "v") for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    m = _model(8, 2, 2, pipeline_schedule="ZBVZeroBubble")
    assert [s.index for s in stages_of_rank(m, 0)] == [0, 3]


def test_account_for_embedding_and_loss() -> None:
    m = _model(6, 2, None, account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    assert stage_layer_counts(m) == [3, 3]  # (6 + 2) / 2 = 4 per stage, one fewer at each end
    m = _model(7, 2, None, account_for_embedding_in_pipeline_split=True)
    assert stage_layer_counts(m) == [3, 4]


def test_uneven_first_and_last_rank_with_virtual_stages() -> None:
    m = _model(10, 3, 2, num_layers_in_first_pipeline_stage=2, num_layers_in_last_pipeline_stage=4)
    # ranks hold 2, 4, 4 layers; each rank's layers split over its 2 virtual stages; stage s is on rank s % 3
    assert stage_layer_counts(m) == [1, 2, 2, 1, 2, 2]
    assert sum(stage_layer_counts(m)) == 10


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"num_layers": 7, "pipeline_model_parallel_size": 2}, "model.num_layers"),
        ({"num_layers": 8, "pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 3},
         "model.virtual_pipeline_model_parallel_size"),
        ({"num_layers": 8, "pipeline_model_parallel_size": 2, "num_layers_in_first_pipeline_stage": 3,
          "account_for_loss_in_pipeline_split": True}, "model.account_for_loss_in_pipeline_split"),
        ({"num_layers": 8, "pipeline_model_parallel_size": 3, "num_layers_in_first_pipeline_stage": 3},
         "model.num_layers_in_first_pipeline_stage"),
        ({"num_layers": 8, "pipeline_model_parallel_size": 2, "num_layers_in_first_pipeline_stage": 9},
         "model.num_layers_in_first_pipeline_stage"),
        ({"num_layers": 8, "pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2,
          "num_layers_in_last_pipeline_stage": 3}, "model.num_layers_in_last_pipeline_stage"),
        ({"num_layers": 8, "pipeline_model_parallel_size": 1, "num_layers_in_last_pipeline_stage": 3},
         "model.pipeline_model_parallel_size"),
    ],
)
def test_impossible_splits_name_the_fields(fields: dict, path: str) -> None:
    with pytest.raises(PipelineLayoutError) as info:
        stage_layer_counts(ModelConfig(**fields))
    assert path in info.value.paths and isinstance(info.value, ValueError)


def test_large_recipe_layouts() -> None:
    m405 = llama31_405b_pretrain_config().model
    assert (m405.pipeline_model_parallel_size, m405.virtual_pipeline_model_parallel_size) == (8, 2)
    counts = stage_layer_counts(m405)
    assert counts == [7] + [8] * 14 + [7] and sum(counts) == 126  # Megatron-Bridge's 405B split
    assert stage_layer_counts(llama3_70b_pretrain_config().model) == [4] * 20
    assert stage_layer_counts(qwen3_32b_pretrain_config().model) == [32, 32]
