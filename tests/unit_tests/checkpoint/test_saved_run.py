"""What a checkpoint folder says about the run that wrote it (checkpoint/saved_run.py): the precision from its
run_config.yaml (ours, Megatron-Bridge's) or, without one, from its DCP metadata; the named error when a run would
load another precision's optimizer state; untrusted YAML never builds objects."""

from pathlib import Path

import pytest
import torch
import yaml
from torch.distributed.checkpoint.metadata import Metadata, TensorProperties, TensorStorageMetadata

from megatron_bridge.checkpoint import saved_run
from megatron_bridge.checkpoint.mcore_checkpoint import saved_parallel_sizes
from megatron_bridge.checkpoint.saved_run import PrecisionMismatchError
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.errors import CheckpointError


FLAGS = {"fp32": (False, False), "bf16_mixed": (True, False), "fp16_mixed": (False, True)}


def _run(precision: str) -> ConfigContainer:
    cfg = ConfigContainer()
    cfg.optimizer.bf16, cfg.optimizer.fp16 = FLAGS[precision]
    return cfg


def _folder(tmp_path: Path, precision: str | None = None, text: str | None = None) -> Path:
    folder = tmp_path / "iter_0000002"
    folder.mkdir()
    if precision is not None:  # what cfg.to_yaml() / Megatron-Bridge's run_config.yaml record
        bf16, fp16 = FLAGS[precision]
        text = yaml.safe_dump({"model": {"tensor_model_parallel_size": 2}, "mixed_precision": precision,
                               "optimizer": {"bf16": bf16, "fp16": fp16, "lr": 1e-3}})
    if text is not None:
        (folder / "run_config.yaml").write_text(text)
    return folder


def _metadata(**dtypes: torch.dtype) -> Metadata:
    return Metadata({key.replace("__", "."): TensorStorageMetadata(TensorProperties(dtype=dtype), torch.Size([4]), [])
                     for key, dtype in dtypes.items()})


@pytest.mark.parametrize(("saved", "now"), [("fp32", "bf16_mixed"), ("bf16_mixed", "fp32"),
                                            ("fp16_mixed", "bf16_mixed"), ("bf16_mixed", "fp16_mixed")])
def test_another_precision_is_a_named_error(tmp_path: Path, saved: str, now: str) -> None:
    folder = _folder(tmp_path, saved)
    with pytest.raises(PrecisionMismatchError) as info:
        saved_run.check_precision(_run(now), folder)
    message = str(info.value)
    assert isinstance(info.value, CheckpointError) and isinstance(info.value, ValueError)
    for part in (repr(str(folder)), f"mixed_precision={saved!r} run", f"this run is mixed_precision={now!r}",
                 "checkpoint.load_optim=False", f"or set mixed_precision={saved!r}"):
        assert part in message, (part, message)


@pytest.mark.parametrize("precision", sorted(FLAGS))
def test_the_same_precision_passes(tmp_path: Path, precision: str) -> None:
    saved_run.check_precision(_run(precision), _folder(tmp_path, precision))


def test_precision_of_our_own_run_config(tmp_path: Path) -> None:
    cfg = _run("bf16_mixed")
    folder = tmp_path / "iter_0000001"
    folder.mkdir()
    (folder / "run_config.yaml").write_text(cfg.to_yaml())
    assert saved_run.saved_precision(folder) == "bf16_mixed"
    with pytest.raises(PrecisionMismatchError, match="mixed_precision='bf16_mixed' run"):
        saved_run.check_precision(_run("fp32"), folder)


def test_without_run_config_the_model_tensor_dtypes_decide(tmp_path: Path) -> None:
    folder = _folder(tmp_path)  # Megatron-LM: no run_config.yaml
    bf16 = _metadata(embedding__word_embeddings__weight=torch.bfloat16, decoder__final_layernorm__weight=torch.bfloat16,
                     optimizer__state__fp32_param__embedding__word_embeddings__weight=torch.float32)
    fp32 = _metadata(embedding__word_embeddings__weight=torch.float32,
                     optimizer__state__exp_avg__embedding__word_embeddings__weight=torch.float32)
    assert saved_run.saved_precision(folder, bf16) == "bf16_mixed"
    assert saved_run.saved_precision(folder, fp32) == "fp32"
    with pytest.raises(PrecisionMismatchError, match="mixed_precision='fp32' run"):
        saved_run.check_precision(_run("bf16_mixed"), folder, fp32)
    mixed = _metadata(a=torch.bfloat16, b=torch.float16)
    assert saved_run.saved_precision(folder, mixed) is None  # undecidable: not refused
    saved_run.check_precision(_run("fp32"), folder, mixed)


@pytest.mark.parametrize("text", [
    "!!python/object/apply:os.system ['echo pwned > /tmp/mb_saved_run_pwned']",  # safe_load refuses: unknown
    "optimizer: {bf16: yes please, fp16: false}",  # not booleans
    "optimizer: {bf16: true, fp16: true}",  # both: not a precision
    "- just a list",
    "optimizer: [1, 2",  # not YAML
])
def test_untrusted_or_odd_run_config_is_unknown_not_refused(tmp_path: Path, text: str) -> None:
    folder = _folder(tmp_path, text=text)
    assert saved_run.saved_precision(folder) is None
    saved_run.check_precision(_run("bf16_mixed"), folder)
    assert not Path("/tmp/mb_saved_run_pwned").exists()
    assert saved_parallel_sizes(folder) is None


def test_parallel_sizes_come_from_the_same_reader(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "fp32")
    assert saved_parallel_sizes(folder) == (2, 1)
    assert saved_parallel_sizes(tmp_path) is None  # no run_config.yaml


def test_model_differences_name_the_saved_fields(tmp_path: Path) -> None:
    cfg = ConfigContainer()
    cfg.model.hidden_size, cfg.model.num_layers = 48, 2
    folder = _folder(tmp_path, text=yaml.safe_dump({"model": {"hidden_size": 32, "num_layers": 2,
                                                              "tensor_model_parallel_size": 4,
                                                              "ffn_hidden_size": {"not": "a scalar"}}}))
    assert saved_run.model_differences(folder, cfg.model) == ["model.hidden_size=32 (this run: 48)"]
    fix = saved_run.model_mismatch_fix(folder, cfg.model)
    assert "model.hidden_size=32 (this run: 48)" in fix and "set those fields as saved" in fix
    assert "checkpoint.load" in saved_run.model_mismatch_fix(tmp_path)  # no run_config.yaml: the general fix
    assert saved_run.model_differences(tmp_path, cfg.model) == []


def test_distributed_optimizer_state_at_another_tp_pp_is_a_named_error(tmp_path: Path) -> None:
    """The distributed optimizer's dp_reshardable state loads at another DP size only: another (TP, PP) than the
    checkpoint's run_config.yaml records is refused, naming the folder, both layouts and the three fixes."""
    from megatron_bridge.checkpoint.mcore_checkpoint import _check_optimizer_resharding

    folder = _folder(tmp_path, "fp32")  # saved at TP=2, PP=1
    cfg = _run("fp32")
    cfg.optimizer.use_distributed_optimizer = True
    with pytest.raises(CheckpointError) as info:
        _check_optimizer_resharding(cfg, folder, "dp_reshardable")
    message = str(info.value)
    for part in (repr(str(folder)), "(TP, PP) = (2, 1)", "this run: (1, 1)", "checkpoint.load_optim=False",
                 "checkpoint.dist_ckpt_optim_fully_reshardable=True"):
        assert part in message, (part, message)
    _check_optimizer_resharding(cfg, folder, "fully_reshardable")  # loads at any layout
    cfg.model.tensor_model_parallel_size = 2
    _check_optimizer_resharding(cfg, folder, "dp_reshardable")  # the same layout
    cfg.model.tensor_model_parallel_size, cfg.optimizer.use_distributed_optimizer = 1, False
    _check_optimizer_resharding(cfg, folder, None)  # megatron-core's other optimizers reshard


def test_optimizer_layout_fix_names_the_backend_that_wrote_the_checkpoint(tmp_path: Path) -> None:
    """A failed load of another backend kind's optimizer state (Megatron FSDP: nested per parameter; DDP, FSDP2:
    flat) gets the fix; the same kind, no optimizer state or an unknown writer get nothing."""
    folder = tmp_path / "iter_0000004"
    folder.mkdir()
    (folder / "run_config.yaml").write_text(yaml.safe_dump({"dist": {"use_megatron_fsdp": True}}))
    flat = {"model": {}, "optimizer": {"state.w.exp_avg": torch.zeros(1)}}
    nested = {"model": {}, "optimizer": {"state": {"w": {"exp_avg": torch.zeros(1)}}, "param_groups": []}}
    fix = saved_run.optimizer_layout_fix(folder, flat)
    assert "written by Megatron FSDP" in fix and "checkpoint.load_optim=False" in fix
    assert "dist.use_megatron_fsdp=True" in fix
    assert saved_run.optimizer_layout_fix(folder, nested) == ""
    assert saved_run.optimizer_layout_fix(folder, {"model": {}}) == ""
    (folder / "run_config.yaml").write_text(yaml.safe_dump({"dist": {"use_megatron_fsdp": False}}))
    assert "written by DDP or FSDP2" in saved_run.optimizer_layout_fix(folder, nested)
    assert saved_run.optimizer_layout_fix(folder, flat) == ""
    (folder / "run_config.yaml").write_text(yaml.safe_dump({"model": {}}))
    assert saved_run.optimizer_layout_fix(folder, nested) == ""
