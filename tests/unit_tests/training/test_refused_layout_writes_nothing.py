"""A pipeline layout that validate() or pretrain()'s set-up refuses gives a named error and writes nothing: no
run folder, no checkpoint folder, no TensorBoard files, no profiler traces, no saved config, nothing in the working
directory.

Single process: the pipeline refusals come before any process group is created (``WORLD_SIZE`` is set to the
layout's world size so that validate() judges the pipeline rules, not the process count); the last case is refused
by set-up itself, on a 1-process group.
"""

from pathlib import Path
from typing import Any

import pytest

from megatron_bridge.errors import ConfigValidationError, DataError
from megatron_bridge.recipes import tiny_llama_pretrain_config
from megatron_bridge.training.pretrain import pretrain


def _custom_step(state: Any, data_iterator: Any, model: Any) -> Any:
    raise AssertionError("never called: the layout is refused first")


# (id, world size, overrides, the field the error names (in ConfigValidationError.paths), forward step)
REFUSED = [
    ("layers_do_not_split", 2, {"model.pipeline_model_parallel_size": 2,
                                "model.virtual_pipeline_model_parallel_size": 3}, "model.num_layers", None),
    ("first_stage_takes_every_layer", 2, {"model.pipeline_model_parallel_size": 2,
                                          "model.num_layers_in_first_pipeline_stage": 4},
     "model.num_layers_in_first_pipeline_stage", None),
    ("v_schedule_needs_vp2", 2, {"model.pipeline_model_parallel_size": 2,
                                 "model.virtual_pipeline_model_parallel_size": 4,
                                 "model.pipeline_schedule": "ZBVZeroBubble"}, "model.pipeline_schedule", None),
    ("too_few_microbatches", 4, {"model.pipeline_model_parallel_size": 4, "train.global_batch_size": 8,
                                 "train.micro_batch_size": 4}, "train.global_batch_size", None),
    ("pp_does_not_divide_world", 3, {"model.pipeline_model_parallel_size": 2}, "model.pipeline_model_parallel_size",
     None),
    ("custom_forward_step_under_pp", 2, {"model.pipeline_model_parallel_size": 2},
     "model.pipeline_model_parallel_size", _custom_step),
    # refused by set-up, after validate() and after the process group exists (1 process): still nothing written
    ("setup_refuses_missing_tokenizer", 1, {"tokenizer.tokenizer_type": "huggingface",
                                            "tokenizer.tokenizer_file": "/nonexistent/tokenizer.json"},
     "tokenizer.tokenizer_file", None),
]


@pytest.fixture
def no_process_group() -> None:
    """validate() takes the world size from an initialized process group before ``WORLD_SIZE``: drop a 1-rank group
    an earlier test of this process left behind."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.usefixtures("no_process_group")
@pytest.mark.parametrize(("world", "overrides", "field", "step"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_refused_pipeline_layout_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world: int,
                                                overrides: dict[str, Any], field: str, step: Any) -> None:
    monkeypatch.chdir(tmp_path)  # the default run folder (nemo_experiments/) would land here
    monkeypatch.setenv("WORLD_SIZE", str(world))
    run = tmp_path / "run"
    cfg = tiny_llama_pretrain_config(dir=str(run), train_iters=2)
    cfg.logger.save_config_filepath = str(run / "config.yaml")
    cfg.profiling.use_pytorch_profiler, cfg.profiling.trace_dir = True, str(run / "traces")  # written at set-up
    cfg.profiling.profile_step_start, cfg.profiling.profile_step_end = 1, 2
    cfg = cfg.apply_overrides(overrides=[f"{k}={v}" for k, v in overrides.items()])
    assert cfg.checkpoint.save == str(run / "checkpoints") and cfg.logger.tensorboard_dir == str(run / "tb_logs")
    with pytest.raises((ConfigValidationError, DataError)) as info:
        pretrain(cfg, step) if step is not None else pretrain(cfg)
    assert field in getattr(info.value, "paths", ()) or field in str(info.value), info.value
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == []
