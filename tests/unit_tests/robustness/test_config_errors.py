"""Config values from the command line: the documented blend syntax, values a preset would overwrite, and resuming
with train_iters below the checkpoint's step."""

import pytest

from megatron_bridge.data.loaders import parse_data_path
from megatron_bridge.errors import ConfigOverrideError, ConfigValidationError
from megatron_bridge.recipes import tiny_llama_pretrain_config


def test_documented_blend_syntax_is_accepted():
    cfg = tiny_llama_pretrain_config().apply_overrides(
        overrides=["dataset.data_path=[0.7,a_text_document,0.3,b_text_document]", "dataset.mock=false"])
    assert cfg.dataset.data_path == ["0.7", "a_text_document", "0.3", "b_text_document"]
    assert parse_data_path(cfg.dataset.data_path) == (["a_text_document", "b_text_document"], [0.7, 0.3])
    assert tiny_llama_pretrain_config().apply_overrides(
        overrides=["dataset.data_path=[1,a,3,b]"]).dataset.data_path == ["1", "a", "3", "b"]


def test_command_line_value_a_preset_would_overwrite_is_an_error():
    cfg = tiny_llama_pretrain_config()  # mixed_precision="fp32"
    with pytest.raises(ConfigOverrideError, match=r"optimizer.bf16=True would be replaced by mixed_precision='fp32'"):
        cfg.apply_overrides(overrides=["optimizer.bf16=true"])
    assert cfg.apply_overrides(overrides=["optimizer.bf16=false"]).optimizer.bf16 is False  # agrees: fine
    chosen = cfg.apply_overrides(overrides=["mixed_precision=null", "optimizer.bf16=true"]).validate()
    assert chosen.optimizer.bf16 is True  # no preset: the value stays
    assert cfg.apply_overrides(overrides=["mixed_precision=bf16_mixed", "optimizer.bf16=true"]).optimizer.bf16


def test_resume_with_train_iters_below_the_checkpoint_step_says_so(tmp_path):
    from megatron_bridge.training.pretrain import pretrain

    def config(train_iters: int):  # noqa: ANN202
        cfg = tiny_llama_pretrain_config(train_iters=train_iters, global_batch_size=2, micro_batch_size=1,
                                         seq_length=16, eval_interval=None, lr_warmup_iters=1, log_interval=100,
                                         dir=str(tmp_path))
        cfg.model.num_layers, cfg.model.hidden_size, cfg.model.ffn_hidden_size = 1, 32, 64
        cfg.logger.tensorboard_dir = None
        cfg.scheduler.lr_decay_iters = 4  # the same schedule in both runs: only train_iters differs
        return cfg

    pretrain(config(4))
    with pytest.raises(ConfigValidationError, match=r"is at step 4, beyond train.train_iters=2: set "
                                                    r"train.train_iters >= 4"):
        pretrain(config(2))
