"""Megatron-Bridge's ``training.utils.omegaconf_utils`` (src/megatron/bridge/training/utils/omegaconf_utils.py at
067f987) over this library's config: its tutorial ``tutorials/recipes/llama/02_pretrain_with_yaml.py`` with its YAML
``conf/llama32_1b_pretrain.yaml``, the YAML and Hydra-style blocks of its ``docs/recipe-usage.md`` (each with
``megatron.bridge`` renamed ``megatron_bridge``), and ``run_recipe.py --config-file`` on the same YAML; its moved keys
(``train.eval_iters``) are mapped with one logged line, unknown keys refused with the nearest one."""

import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from megatron_bridge.errors import ConfigOverrideError, OverridesError
from megatron_bridge.recipes.llama import llama32_1b_pretrain_config
from megatron_bridge.training.utils.omegaconf_utils import (
    apply_overrides,
    create_omegaconf_dict_config,
    parse_hydra_overrides,
    process_config_with_overrides,
)
from tests.unit_tests.scripts import load_script


TUTORIAL_YAML = """\
dataset:
  seq_length: 4096
train:
  train_iters: 100
  global_batch_size: 8
  micro_batch_size: 1
  eval_iters: 10
  eval_interval: 50
optimizer:
  lr: 0.0003
  min_lr: 0.00003
  weight_decay: 0.1
scheduler:
  lr_warmup_iters: 20
  lr_decay_style: cosine
checkpoint:
  save: ./checkpoints/llama32_1b
  load: ./checkpoints/llama32_1b
  save_interval: 50
model:
  seq_length: 4096
  tensor_model_parallel_size: 1
  pipeline_model_parallel_size: 1
  context_parallel_size: 1
logger:
  log_interval: 10
  tensorboard_dir: ./logs/llama32_1b
rng:
  seed: 1234
"""
"""tutorials/recipes/llama/conf/llama32_1b_pretrain.yaml, comments left out."""


def _tutorial_folder(tmp_path: Path) -> Path:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "llama32_1b_pretrain.yaml").write_text(TUTORIAL_YAML)
    return tmp_path


def _assert_tutorial_values(cfg: Any, train_iters: int = 100) -> None:
    assert (cfg.train.train_iters, cfg.train.global_batch_size, cfg.train.micro_batch_size) == (train_iters, 8, 1)
    assert (cfg.validation.eval_iters, cfg.validation.eval_interval) == (10, 50)
    assert (cfg.optimizer.lr, cfg.optimizer.min_lr, cfg.scheduler.lr_decay_style) == (3e-4, 3e-5, "cosine")
    assert (cfg.checkpoint.save, cfg.checkpoint.save_interval) == ("./checkpoints/llama32_1b", 50)
    assert cfg.model.seq_length == cfg.dataset.seq_length == 4096 and cfg.rng.seed == 1234
    cfg.validate(world_size=1)


def _moved_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is deprecated (as in Megatron-Bridge)" in r.getMessage()]


TUTORIAL_02_MAIN = """
import argparse
from pathlib import Path

from megatron_bridge.recipes.llama import llama32_1b_pretrain_config
from megatron_bridge.training.config import ConfigContainer
from megatron_bridge.training.gpt_step import forward_step
from megatron_bridge.training.pretrain import pretrain
from megatron_bridge.training.utils.omegaconf_utils import process_config_with_overrides

SCRIPT_DIR = Path(__file__).parent.resolve()
DEFAULT_CONFIG_FILE = SCRIPT_DIR / "conf" / "llama32_1b_pretrain.yaml"

def parse_args():
    parser = argparse.ArgumentParser(formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--config-file", type=str, default=str(DEFAULT_CONFIG_FILE))
    parser.add_argument("--debug", action="store_true", help="Enable debug logging")
    args, cli_overrides = parser.parse_known_args()
    return args, cli_overrides

def main() -> None:
    args, cli_overrides = parse_args()
    config: ConfigContainer = llama32_1b_pretrain_config()
    config = process_config_with_overrides(
        config,
        config_filepath=args.config_file,
        cli_overrides=cli_overrides or None,
    )
    pretrain(config=config, forward_step_func=forward_step)

if __name__ == "__main__":
    main()
"""
"""tutorials/recipes/llama/02_pretrain_with_yaml.py, its code with docstrings, help texts and logging left out."""


def test_tutorial_02_runs_with_its_yaml_and_a_cli_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """Up to ``pretrain``, which records its config here: a 1B-parameter run does not fit a unit test on CPU."""
    import megatron_bridge.training.pretrain as pretrain_module

    folder = _tutorial_folder(tmp_path)
    seen: list[Any] = []
    monkeypatch.setattr(pretrain_module, "pretrain", lambda config, forward_step_func: seen.append(config))
    monkeypatch.setattr(sys, "argv", ["02_pretrain_with_yaml.py", "train.train_iters=10000"])
    with caplog.at_level(logging.WARNING, logger="megatron_bridge"):
        exec(compile(TUTORIAL_02_MAIN, "02_pretrain_with_yaml.py", "exec"),
             {"__name__": "__main__", "__file__": str(folder / "02_pretrain_with_yaml.py")})
    _assert_tutorial_values(seen[0], train_iters=10000)
    assert _moved_lines(caplog) == [
        "train.eval_iters is deprecated (as in Megatron-Bridge): set validation.eval_iters instead; using "
        "validation.eval_iters=10",
        "train.eval_interval is deprecated (as in Megatron-Bridge): set validation.eval_interval instead; using "
        "validation.eval_interval=50",
    ]


def test_run_recipe_config_file_takes_the_tutorial_yaml(tmp_path: Path) -> None:
    run_recipe = load_script("scripts/training/run_recipe.py")
    path = _tutorial_folder(tmp_path) / "conf" / "llama32_1b_pretrain.yaml"
    args = run_recipe.parse_args(["--recipe", "llama32_1b", "--config-file", str(path)])
    _assert_tutorial_values(run_recipe.build_config(args))


def test_recipe_usage_yaml_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/recipe-usage.md "YAML": its file name, holding the tutorial YAML."""
    from megatron_bridge.recipes.llama import llama3_8b_pretrain_config
    from megatron_bridge.training.config import ConfigContainer

    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "llama3-8b-benchmark-cfg.yaml").write_text(TUTORIAL_YAML)
    monkeypatch.chdir(tmp_path)
    cfg: ConfigContainer = llama3_8b_pretrain_config()
    yaml_filepath = "conf/llama3-8b-benchmark-cfg.yaml"
    merged_omega_conf, excluded_fields = create_omegaconf_dict_config(cfg)
    yaml_overrides_omega = OmegaConf.load(yaml_filepath)
    merged_omega_conf = OmegaConf.merge(merged_omega_conf, yaml_overrides_omega)
    final_overrides_as_dict = OmegaConf.to_container(merged_omega_conf, resolve=True)
    apply_overrides(cfg, final_overrides_as_dict, excluded_fields)
    assert excluded_fields == {}
    assert cfg.model.num_layers == 32 and cfg.model.seq_length == 4096  # the 8B model, the YAML's values
    assert (cfg.train.train_iters, cfg.validation.eval_iters, cfg.optimizer.lr) == (100, 10, 3e-4)


def test_recipe_usage_hydra_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/recipe-usage.md "Hydra-style", with its command line's overrides."""
    from megatron_bridge.recipes.llama import llama3_8b_pretrain_config
    from megatron_bridge.training.config import ConfigContainer

    monkeypatch.setattr(sys, "argv", ["pretrain_cli_overrides.py", "model.tensor_model_parallel_size=4",
                                      "train.train_iters=100000"])
    cfg: ConfigContainer = llama3_8b_pretrain_config()
    cli_overrides = sys.argv[1:]
    merged_omega_conf, excluded_fields = create_omegaconf_dict_config(cfg)
    merged_omega_conf = parse_hydra_overrides(merged_omega_conf, cli_overrides)
    final_overrides_as_dict = OmegaConf.to_container(merged_omega_conf, resolve=True)
    apply_overrides(cfg, final_overrides_as_dict, excluded_fields)
    assert (cfg.model.tensor_model_parallel_size, cfg.train.train_iters) == (4, 100000)


@pytest.mark.parametrize(("overrides", "message"), [
    (["train.micro_batch_sise=2"], "no key 'train.micro_batch_sise'; did you mean 'train.micro_batch_size'"),
    (["+train.new_key=1"], "adding or deleting keys is not supported"),
    (["~train.train_iters"], "must look like 'section.key=value'"),
    (["train.train_iters=${oc.env:HOME}"], "interpolations are not supported"),
])
def test_hydra_overrides_refused_with_the_fix(overrides: list[str], message: str) -> None:
    omega, _ = create_omegaconf_dict_config(llama32_1b_pretrain_config())
    with pytest.raises(OverridesError, match=f"Failed to parse Hydra overrides: .*{message}"):
        parse_hydra_overrides(omega, overrides)
    with pytest.raises(OverridesError, match=message):
        process_config_with_overrides(llama32_1b_pretrain_config(), cli_overrides=overrides)


def test_unknown_yaml_key_and_wrong_type_are_refused_and_nothing_is_set(tmp_path: Path) -> None:
    cfg = llama32_1b_pretrain_config()
    before = cfg.to_yaml()
    with pytest.raises(ConfigOverrideError, match=r"unknown config key 'train.micro_batch_sise' \(did you mean"):
        apply_overrides(cfg, {"train": {"train_iters": 5, "micro_batch_sise": 2}}, {})
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  train_iters: 5\n  global_batch_size: many\n")
    with pytest.raises(ConfigOverrideError, match="train.global_batch_size"):
        process_config_with_overrides(cfg, config_filepath=str(path))
    assert cfg.to_yaml() == before


def test_moved_keys_null_is_dropped_and_the_deprecated_key_wins(caplog: pytest.LogCaptureFixture) -> None:
    """As Megatron-Bridge: ``train.eval_iters: null`` (its to_yaml's "not set") is no value; a set one replaces
    ``validation.eval_iters``."""
    cfg = llama32_1b_pretrain_config()
    with caplog.at_level(logging.WARNING, logger="megatron_bridge"):
        apply_overrides(cfg, {"train": {"eval_iters": None, "eval_interval": None}}, {})
        assert _moved_lines(caplog) == [] and cfg.validation.eval_iters == 32
        apply_overrides(cfg, {"train": {"eval_iters": 3}, "validation": {"eval_iters": 7}}, {})
    assert cfg.validation.eval_iters == 3 and len(_moved_lines(caplog)) == 1


def test_process_config_changes_the_config_in_place_and_returns_it() -> None:
    cfg = llama32_1b_pretrain_config()
    assert process_config_with_overrides(cfg, cli_overrides=["optimizer.lr=0.001"]) is cfg
    assert cfg.optimizer.lr == 0.001
    with pytest.raises(ConfigOverrideError, match="takes a config dataclass"):
        create_omegaconf_dict_config({"train": {}})
