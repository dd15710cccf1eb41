"""The config classes import from Megatron-Bridge's path and from the package's lowest floor, without torch."""

import subprocess
import sys

import megatron_bridge.config as config_floor
import megatron_bridge.training.config as mb_path


def test_training_config_reexports_every_config_class() -> None:
    assert set(mb_path.__all__) == set(config_floor.__all__)
    for name in config_floor.__all__:
        assert getattr(mb_path, name) is getattr(config_floor, name)


def test_megatron_bridge_import_line_works() -> None:
    from megatron_bridge.training.config import ConfigContainer, OptimizerConfig, TrainingConfig

    cfg = ConfigContainer()
    assert isinstance(cfg.optimizer, OptimizerConfig)
    assert isinstance(cfg.train, TrainingConfig)


def test_config_floor_imports_no_torch() -> None:
    code = "import sys, megatron_bridge.training.config, megatron_bridge.recipes; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_megatron_bridge_class_alias() -> None:
    from megatron_bridge.training.config import ConfigContainer, GPTDatasetConfig

    cfg = ConfigContainer(dataset=GPTDatasetConfig(seq_length=64))
    assert isinstance(cfg.dataset, config_floor.DatasetConfig) and GPTDatasetConfig is config_floor.DatasetConfig
