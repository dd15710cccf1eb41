"""The Bridge's writers never overwrite what they did not write (issue 45, item 7): ``save_megatron_model``
into a folder holding a run, ``save_hf_weights`` into a folder holding weights; both need ``overwrite=True``."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from megatron_bridge.bridge import AutoBridge
from megatron_bridge.checkpoint import files
from megatron_bridge.errors import BridgeError, CheckpointOverwriteError, PathError
from tests.unit_tests.bridge.hf_models import hf_model, write_tokenizer


@pytest.fixture(scope="module")
def bridge_and_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[AutoBridge, list[torch.nn.Module]]:
    folder = tmp_path_factory.mktemp("hf")
    hf_model("llama3.2-tied").save_pretrained(folder)
    write_tokenizer(folder)
    bridge = AutoBridge.from_hf_pretrained(folder)
    return bridge, bridge.to_megatron_model(wrap_with_ddp=False)


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _run_folder(root: Path) -> Path:
    (root / "iter_0000050").mkdir(parents=True)
    (root / "iter_0000050" / "weights.distcp").write_bytes(b"newer checkpoint")
    (root / files.TRACKER_FILENAME).write_text("50\n")
    return root


def test_save_megatron_model_refuses_a_run_folder(bridge_and_model, tmp_path: Path) -> None:  # noqa: ANN001
    bridge, model = bridge_and_model
    run = _run_folder(tmp_path / "run")
    before = _tree(run)
    with pytest.raises(CheckpointOverwriteError, match=r"holds a training run \(latest step 50.*overwrite=True"):
        bridge.save_megatron_model(model, run)
    assert _tree(run) == before
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no staging folder left


def test_save_megatron_model_refuses_a_folder_with_other_files(bridge_and_model, tmp_path: Path) -> None:  # noqa: ANN001
    bridge, model = bridge_and_model
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(BridgeError, match="already exists and is not empty"):
        bridge.save_megatron_model(model, tmp_path / "out")
    assert _tree(tmp_path / "out") == {"notes.txt": b"mine"}


def test_save_megatron_model_overwrite_replaces_the_run_whole(bridge_and_model, tmp_path: Path) -> None:  # noqa: ANN001
    bridge, model = bridge_and_model
    run = _run_folder(tmp_path / "run")
    bridge.save_megatron_model(model, run, overwrite=True)
    assert files.list_checkpoints(run) == [0] and not (run / "iter_0000050").exists()
    assert files.read_tracker_step(run) == 0
    loaded = bridge.load_megatron_model(run)
    assert torch.equal(loaded[0].state_dict()["embed_tokens.weight"], model[0].state_dict()["embed_tokens.weight"])


def test_save_hf_weights_refuses_existing_weights_and_keeps_other_files(bridge_and_model,  # noqa: ANN001
                                                                       tmp_path: Path) -> None:
    bridge, model = bridge_and_model
    out = tmp_path / "w"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"precious")
    (out / "config.json").write_text("{}")
    with pytest.raises(BridgeError, match=r"already holds weights \['model.safetensors'\].*overwrite=True"):
        bridge.save_hf_weights(model, out)
    assert _tree(out) == {"config.json": b"{}", "model.safetensors": b"precious"}

    bridge.save_hf_weights(model, out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]  # no staging folder left
    assert "model.embed_tokens.weight" in load_file(str(out / "model.safetensors"))


def test_save_hf_weights_into_a_folder_of_other_files_and_stale_shards(bridge_and_model,  # noqa: ANN001
                                                                       tmp_path: Path) -> None:
    bridge, model = bridge_and_model
    out = tmp_path / "w"
    out.mkdir()
    (out / "tokenizer.json").write_text("{}")
    bridge.save_hf_weights(model, out)  # no weights there: nothing to refuse
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "tokenizer.json"]
    bridge.save_hf_weights(model, out, max_shard_size="20KB", overwrite=True)
    names = sorted(p.name for p in out.iterdir())
    assert "model.safetensors" not in names and "model.safetensors.index.json" in names  # the old set is gone


def test_save_hf_weights_refuses_a_file_path(bridge_and_model, tmp_path: Path) -> None:  # noqa: ANN001
    bridge, model = bridge_and_model
    (tmp_path / "f").write_text("x")
    with pytest.raises(PathError, match="is a regular file, not a folder"):
        bridge.save_hf_weights(model, tmp_path / "f")
    assert (tmp_path / "f").read_text() == "x"


def test_import_ckpt_refuses_what_megatron_core_cannot_build_before_reading_weights(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 45, item 7: a folder whose weights megatron-core cannot build (attention biases without MLP biases: its
    add_bias_linear sets both) imported with engine='megatron_core' gets the named refusal of rule
    megatron_core_features, not "the weights do not fit the model config"; no weight is read, nothing is written.
    (MoE folders convert: tests/unit_tests/bridge/test_cross_engine.py.)"""
    from megatron_bridge.bridge import weights as hf_weights

    folder = tmp_path / "hf"
    hf_model("llama3-biases").save_pretrained(folder)
    read: list[str] = []
    monkeypatch.setattr(hf_weights.HFModelWeights, "__getitem__", lambda self, name: read.append(name))
    with pytest.raises(BridgeError, match=r"import_ckpt\('.*hf', engine='megatron_core'\): "
                       r"model.attention_output_bias=.*: not supported by model.engine='megatron_core' .*rule "
                       r"megatron_core_features.*convert with engine='native'"):
        AutoBridge.import_ckpt(folder, tmp_path / "out", engine="megatron_core")
    assert read == [] and sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
