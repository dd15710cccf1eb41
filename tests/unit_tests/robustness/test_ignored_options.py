"""Options that would do nothing are refused (issue 27 item 9): a key repeated in a YAML file (safe_load keeps the
last one), ``${...}`` interpolations in command-line overrides (they never see the recipe), and a profiler window
that ends before it starts. Each is one ``error: ...`` line and exit code 2 from run_recipe.py."""

from pathlib import Path
from types import ModuleType

import pytest

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.errors import ConfigOverrideError
from megatron_bridge.recipes import tiny_llama_pretrain_config
from megatron_bridge.utils.cli import EXIT_USER_ERROR, run_cli
from tests.unit_tests.scripts import load_script


def _run_recipe() -> ModuleType:
    return load_script("scripts/training/run_recipe.py")


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = run_cli(_run_recipe().main, ["--recipe", "tiny_llama", "--dry-run", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USER_ERROR, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_duplicate_yaml_key_is_refused_with_both_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  train_iters: 5\n  global_batch_size: 8\n  train_iters: 7\n")
    with pytest.raises(ConfigOverrideError, match=r"key 'train_iters' appears twice in one mapping \(lines 2 and 4\)"):
        tiny_llama_pretrain_config().apply_overrides(path)
    assert "run.yaml" in _cli(["--config-file", str(path)], capsys)


def test_yaml_without_duplicates_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  train_iters: 7\nvalidation:\n  eval_iters: 1\n")
    cfg = tiny_llama_pretrain_config().apply_overrides(path)
    assert (cfg.train.train_iters, cfg.validation.eval_iters) == (7, 1)
    assert ConfigContainer.from_yaml(_written(tmp_path, cfg)).train.train_iters == 7


def _written(tmp_path: Path, cfg: ConfigContainer) -> Path:
    cfg.to_yaml(tmp_path / "full.yaml")
    return tmp_path / "full.yaml"


@pytest.mark.parametrize("override", ["train.train_iters=${train.global_batch_size}",
                                      "checkpoint.save=${oc.env:HOME}/ckpt"])
def test_interpolation_in_an_override_is_refused(override: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigOverrideError, match=r"\$\{\.\.\.\} interpolations are not supported"):
        tiny_llama_pretrain_config().apply_overrides(None, [override])
    assert override in _cli([override], capsys)


def test_profiler_window_ending_before_it_starts_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = _cli(["profiling.use_pytorch_profiler=true", "profiling.profile_step_start=5",
                 "profiling.profile_step_end=3"], capsys)
    assert "profiling.profile_step_start=5 is after profiling.profile_step_end=3" in line
    assert "[rule profiling_settings]" in line
