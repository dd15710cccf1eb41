"""Truncated, corrupt, partial and hostile checkpoints fail at load with a named CheckpointError."""

import json
import pickle
import shutil

import pytest
import torch

from megatron_bridge.checkpoint import files
from megatron_bridge.checkpoint.reader import read_dcp_metadata
from megatron_bridge.errors import CheckpointError
from tests.unit_tests.checkpoint.toy import build_run, tiny_cfg, train


@pytest.fixture(params=["torch_dist", "torch"])
def saved(request, tmp_path_factory):
    """A checkpoint root with steps 1 and 2 (format from the param) and the folder of step 2."""
    root = tmp_path_factory.mktemp("ckpt")
    run = build_run(tiny_cfg(save=str(root), ckpt_format=request.param))
    for _ in range(2):
        train(run, 1)
        run.manager.save()
    return root, files.iteration_dir(root, 2)


def load(root, **options):
    return build_run(tiny_cfg(load=str(root), **options)).manager.load()


def biggest_file(folder):
    return max((p for p in folder.iterdir() if p.name != "manifest.json"), key=lambda p: p.stat().st_size)


def test_flipped_byte_fails_the_checksum(saved):
    root, folder = saved
    shard = biggest_file(folder)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="fails its crc32 check"):
        load(root)


def test_truncated_shard_is_a_size_mismatch(saved):
    root, folder = saved
    shard = biggest_file(folder)
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="has size 100 but the manifest says"):
        load(root)


def test_missing_file_listed_in_the_manifest(saved):
    root, folder = saved
    victim = folder / (".metadata" if (folder / ".metadata").exists() else "model_optim.pt")
    victim.unlink()
    with pytest.raises(CheckpointError, match=f"missing file '{victim.name}'"):
        load(root)


def test_missing_manifest_means_incomplete(saved):
    root, folder = saved
    (folder / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="no manifest.json: it is incomplete"):
        load(root)


def test_tracker_pointing_at_a_missing_folder(saved):
    root, folder = saved
    shutil.rmtree(folder)
    with pytest.raises(CheckpointError, match="points at step 2 but .* is missing") as info:
        load(root)
    assert f"'{root}'" in str(info.value) and "set checkpoint.ckpt_step to one of the committed steps" in str(
        info.value) and "'.trash-' folder" in str(info.value)


def test_garbage_trackers(saved):
    root, _ = saved
    (root / "latest_train_state.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="tracker file .* is corrupt"):
        load(root)
    (root / "latest_train_state.pt").unlink()
    (root / "latest_checkpointed_iteration.txt").write_text("twelve\n")
    with pytest.raises(CheckpointError, match="should hold a step number but holds 'twelve'. Fix: set "
                       r"checkpoint.ckpt_step to one of the committed steps \[1, 2\]"):
        load(root)
    torch.save({"step": "two"}, root / "latest_train_state.pt")
    with pytest.raises(CheckpointError, match=r"holds no integer 'step' \(found str\). Fix: set checkpoint.ckpt_step "
                       r"to one of the committed steps \[1, 2\], or delete the file"):
        load(root)


def test_without_trackers_the_newest_committed_folder_is_used(saved):
    root, _ = saved
    (root / "latest_train_state.pt").unlink()
    (root / "latest_checkpointed_iteration.txt").unlink()
    run = build_run(tiny_cfg(load=str(root)))
    assert run.manager.load() and run.state.step == 2


def _rewrite_manifest_entry(folder, name):
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][name] = {"size": (folder / name).stat().st_size, "crc32": files.file_crc32(folder / name)}
    (folder / "manifest.json").write_text(json.dumps(manifest))


class _Hostile:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_pickled_code_in_dcp_metadata_is_refused(tmp_path):
    run = build_run(tiny_cfg(save=str(tmp_path)))
    run.manager.save()
    folder = files.iteration_dir(tmp_path, 0)
    (folder / ".metadata").write_bytes(pickle.dumps(_Hostile()))
    _rewrite_manifest_entry(folder, ".metadata")  # a consistent manifest: only the unpickler stands in the way
    with pytest.raises(CheckpointError, match="builtins.print is not allowed in DCP metadata"):
        load(tmp_path)


def test_pickled_code_in_train_state_is_refused(tmp_path):
    run = build_run(tiny_cfg(save=str(tmp_path), ckpt_format="torch"))
    run.manager.save()
    folder = files.iteration_dir(tmp_path, 0)
    torch.save({"step": _Hostile()}, folder / "train_state.pt")
    _rewrite_manifest_entry(folder, "train_state.pt")
    with pytest.raises(CheckpointError, match="train state file .* is corrupt or holds disallowed objects"):
        load(tmp_path, ckpt_step=0)


def test_dcp_metadata_reader_accepts_real_metadata(saved):
    _, folder = saved
    if (folder / ".metadata").exists():
        assert "model.embed_tokens.weight" in read_dcp_metadata(folder).state_dict_metadata


def test_metadata_unpickler_only_resolves_dcp_classes(tmp_path):
    """Not even a name the allow-listed DCP metadata module merely imports (here ``dataclasses.field``)."""
    cases = {
        b"cbuiltins\nprint\n)R.": "builtins.print",
        b"ctorch.distributed.checkpoint.metadata\nfield\n)R.": "metadata.field",
        b"ctorch.distributed.checkpoint.metadata\ntorch.load\n)R.": "metadata.torch.load",
    }
    for payload, name in cases.items():
        (tmp_path / ".metadata").write_bytes(payload)
        with pytest.raises(CheckpointError, match=f"{name} is not allowed"):
            read_dcp_metadata(tmp_path)
