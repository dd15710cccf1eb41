"""CheckpointManager in one process: resume, formats, selection of what to load, most_recent_k, async save."""

import logging
import time

import pytest
import torch

from megatron_bridge.checkpoint import files
from megatron_bridge.errors import CheckpointError
from tests.unit_tests.checkpoint.toy import build_run, eval_loss, full_weights, tiny_cfg, train


FORMATS = [("ddp", "torch_dist"), ("ddp", "torch"), ("fsdp2", "fsdp_dtensor"), ("fsdp2", "torch")]


@pytest.mark.parametrize(("backend", "fmt"), FORMATS)
def test_resume_is_bit_identical(tmp_path, backend, fmt):
    """N steps + save + a fresh run that loads + N steps == 2N steps: weights, optimizer, schedule, RNG, counters."""
    cfg = tiny_cfg(backend=backend, save=str(tmp_path), load=str(tmp_path), ckpt_format=fmt)
    first = build_run(cfg)
    assert first.manager.load() is False
    train(first, 3)
    first.manager.save()
    expected = train(first, 3)
    expected_state = first.state.state_dict()

    second = build_run(tiny_cfg(backend=backend, save=str(tmp_path), load=str(tmp_path), ckpt_format=fmt), seed=7)
    assert second.manager.load() is True
    assert second.state.step == 3 and second.state.consumed_train_samples == 6
    assert second.scheduler.num_steps == 3
    assert train(second, 3) == expected
    assert second.state.state_dict() == expected_state
    manifest = files.read_manifest(files.iteration_dir(tmp_path, 3))
    assert manifest["format"] == fmt and manifest["backend"] == backend and manifest["world_size"] == 1


def test_layout_files(tmp_path):
    """The documented files exist after a save; trackers point at the step."""
    run = build_run(tiny_cfg(save=str(tmp_path)))
    train(run, 2)
    run.manager.save()
    folder = tmp_path / "iter_0000002"
    names = {p.name for p in folder.iterdir()}
    assert {".metadata", "run_config.yaml", "train_state.pt", "manifest.json", "rng_rank_00000.pt"} <= names
    assert any(n.endswith(".distcp") for n in names)
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert torch.load(tmp_path / "latest_train_state.pt", weights_only=True)["step"] == 2
    assert "checkpoint:" in (folder / "run_config.yaml").read_text()


def test_fresh_start_is_logged(tmp_path, caplog):
    run = build_run(tiny_cfg(load=str(tmp_path / "nothing")))
    with caplog.at_level(logging.INFO, logger="megatron_bridge"):
        assert run.manager.load() is False
    assert "starting fresh" in caplog.text


def test_exit_on_missing_checkpoint(tmp_path):
    run = build_run(tiny_cfg(load=str(tmp_path / "empty"), exit_on_missing_checkpoint=True))
    with pytest.raises(CheckpointError, match="exit_on_missing_checkpoint"):
        run.manager.load()
    src = build_run(tiny_cfg(save=str(tmp_path / "src")))
    src.manager.save()
    with_pretrained = build_run(tiny_cfg(load=str(tmp_path / "empty"), exit_on_missing_checkpoint=True,
                                         pretrained_checkpoint=str(tmp_path / "src")))
    assert with_pretrained.manager.load()  # an empty `load` falls back to pretrained_checkpoint first


def test_should_save_follows_save_interval(tmp_path):
    run = build_run(tiny_cfg(save=str(tmp_path), save_interval=3))
    assert [s for s in range(1, 10) if run.manager.should_save(s)] == [3, 6, 9]
    assert not build_run(tiny_cfg(save=str(tmp_path))).manager.should_save(3)  # no interval: only the final save
    assert not build_run(tiny_cfg(save_interval=3)).manager.should_save(3)  # no folder


def test_most_recent_k_keeps_exactly_k(tmp_path):
    run = build_run(tiny_cfg(save=str(tmp_path), most_recent_k=2, ckpt_format="torch"))
    for _ in range(5):
        train(run, 1, dropout_rng=False)
        run.manager.save()
    assert files.list_checkpoints(tmp_path) == [4, 5]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["iter_0000004", "iter_0000005"]


def test_ckpt_step_selects_an_older_checkpoint(tmp_path):
    run = build_run(tiny_cfg(save=str(tmp_path)))
    train(run, 2)
    run.manager.save()
    weights_at_2 = full_weights(run)
    train(run, 2)
    run.manager.save()
    older = build_run(tiny_cfg(load=str(tmp_path), ckpt_step=2))
    assert older.manager.load() and older.state.step == 2
    assert all(torch.equal(weights_at_2[k], v) for k, v in full_weights(older).items())
    with pytest.raises(CheckpointError, match=r"ckpt_step=3.*available steps: \[2, 4\]"):
        build_run(tiny_cfg(load=str(tmp_path), ckpt_step=3)).manager.load()


@pytest.mark.parametrize("how", ["finetune", "pretrained"])
def test_weights_only_loads_start_at_step_zero(tmp_path, how):
    """finetune / pretrained_checkpoint: the weights, but step 0, a fresh optimizer and schedule."""
    src = build_run(tiny_cfg(save=str(tmp_path / "src")))
    train(src, 3)
    src.manager.save()
    options = ({"load": str(tmp_path / "src"), "finetune": True} if how == "finetune" else
               {"load": str(tmp_path / "empty"), "pretrained_checkpoint": str(tmp_path / "src")})
    dst = build_run(tiny_cfg(**options), seed=5)
    assert dst.manager.load() is True
    assert dst.state.step == 0 and dst.scheduler.num_steps == 0 and not dst.optimizer.state
    assert eval_loss(dst) == eval_loss(src)


def test_without_optimizer_state_the_optimizer_starts_fresh(tmp_path, caplog):
    src = build_run(tiny_cfg(save=str(tmp_path), save_optim=False))
    train(src, 2)
    src.manager.save()
    dst = build_run(tiny_cfg(load=str(tmp_path)))
    with caplog.at_level(logging.INFO, logger="megatron_bridge"):
        assert dst.manager.load()
    assert "holds no optimizer state" in caplog.text
    assert dst.state.step == 2 and not dst.optimizer.state and eval_loss(dst) == eval_loss(src)


def test_rng_is_restored_unless_load_rng_is_false(tmp_path):
    src = build_run(tiny_cfg(save=str(tmp_path)))
    src.manager.save()
    expected = torch.rand(3)
    dst = build_run(tiny_cfg(load=str(tmp_path)), seed=123)
    dst.manager.load()
    assert torch.equal(torch.rand(3), expected)

    no_rng = build_run(tiny_cfg(load=str(tmp_path), load_rng=False), seed=123)
    torch.manual_seed(123)
    no_rng.manager.load()
    assert not torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("fmt", ["torch_dist", "torch"])
def test_shape_mismatch_names_the_keys(tmp_path, fmt):
    src = build_run(tiny_cfg(save=str(tmp_path), ckpt_format=fmt))
    src.manager.save()
    wider = build_run(tiny_cfg(load=str(tmp_path), hidden_size=48))
    with pytest.raises(CheckpointError, match=r"embed_tokens\.weight: checkpoint \[112, 32\] vs model \[112, 48\]"
                       r".* It was saved by another model: model\.hidden_size=32 \(this run: 48\)\. Fix: set those "
                       "fields as saved"):
        wider.manager.load()
    deeper = build_run(tiny_cfg(load=str(tmp_path), num_layers=3))
    with pytest.raises(CheckpointError, match=r"missing from the checkpoint: \['layers\.2\."):
        deeper.manager.load()


def test_async_save_commits_on_poll_or_close(tmp_path):
    cfg = tiny_cfg(save=str(tmp_path), load=str(tmp_path), async_save=True, save_interval=2)
    run = build_run(cfg)
    losses = []
    for _ in range(5):
        losses += train(run, 1)
        run.manager.poll()
        if run.manager.should_save(run.state.step):
            run.manager.save()  # returns after staging; waits for a previous async save first
    run.manager.close()
    assert files.list_checkpoints(tmp_path) == [2, 4]
    assert files.read_tracker_step(tmp_path) == 4
    resumed = build_run(cfg, seed=3)
    resumed.manager.load()
    assert train(resumed, 1) == losses[4:]


def test_saving_the_loaded_step_again_is_a_no_op(tmp_path, caplog):
    run = build_run(tiny_cfg(save=str(tmp_path)))
    train(run, 1)
    run.manager.save()
    before = (tmp_path / "iter_0000001" / "manifest.json").read_text()
    again = build_run(tiny_cfg(save=str(tmp_path), load=str(tmp_path)))
    again.manager.load()
    with caplog.at_level(logging.INFO, logger="megatron_bridge"):
        again.manager.save()
    assert "already exists" in caplog.text
    assert (tmp_path / "iter_0000001" / "manifest.json").read_text() == before


def test_a_different_optimizer_is_a_named_error(tmp_path):
    src = build_run(tiny_cfg(save=str(tmp_path)))
    train(src, 1)
    src.manager.save()
    cfg = tiny_cfg(load=str(tmp_path))
    cfg.optimizer.optimizer, cfg.optimizer.sgd_momentum = "sgd", 0.9
    dst = build_run(cfg)
    train(dst, 1)  # SGD momentum buffers exist; the Adam checkpoint has none
    with pytest.raises(CheckpointError, match=r"rank 0: RuntimeError: Missing key .*momentum_buffer"):
        dst.manager.load()


def _non_daemon_threads() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]


def test_abandoning_an_async_save_in_flight_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """``abandon()`` (pretrain() after a failure) with the step-2 DCP async save in flight: even when its write
    completes afterwards, the step is never committed (trackers keep step 1, no ``iter_0000002``), its threads end,
    and the next start resumes step 1 and removes the interrupted save's folder. The write is held back (a slow file
    system) by delaying its future: DCP still writes every shard."""
    import threading
    from concurrent.futures import Future

    from megatron_bridge.checkpoint import save as saving

    gate = threading.Event()
    gate.set()
    real = saving.start_async_dcp

    def slow_start(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        upload, delayed = real(*args, **kwargs), Future()

        def relay() -> None:
            gate.wait(60)
            try:
                delayed.set_result(upload.result())
            except BaseException as exc:  # noqa: BLE001 (relayed as is)
                delayed.set_exception(exc)

        threading.Thread(target=relay, name="slow-file-system", daemon=True).start()
        return delayed

    monkeypatch.setattr(saving, "start_async_dcp", slow_start)
    before = set(_non_daemon_threads())
    cfg = tiny_cfg(save=str(tmp_path), load=str(tmp_path), async_save=True, save_interval=1)
    run = build_run(cfg)
    train(run, 1)
    run.manager.save()
    run.manager.wait()
    trackers = {name: (tmp_path / name).read_bytes() for name in
                ("latest_checkpointed_iteration.txt", "latest_train_state.pt")}
    gate.clear()
    train(run, 1)
    run.manager.save()  # step 2: staged, its write held back
    deadline = time.monotonic() + 10
    while not run.manager._pending.future.running() and time.monotonic() < deadline:
        time.sleep(0.01)  # the commit thread waits for the write (as after a few training steps)
    run.manager.abandon()
    gate.set()  # the write completes after abandon()
    deadline = time.monotonic() + 30
    while set(_non_daemon_threads()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not set(_non_daemon_threads()) - before, _non_daemon_threads()
    assert {name: (tmp_path / name).read_bytes() for name in trackers} == trackers
    assert files.list_checkpoints(tmp_path) == [1]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("iter_0000002.tmp-")]
    resumed = build_run(cfg, seed=3)
    assert resumed.manager.load() and resumed.state.step == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("iter_")) == ["iter_0000001"]
    resumed.manager.close()


def test_native_optimizer_state_resumes_across_precisions(tmp_path):
    """Native engine: a bf16_mixed run keeps fp32 weights and fp32 Adam state (bf16 is the forward's compute dtype
    only), so its checkpoint resumes in an fp32 run with the optimizer, every weight and Adam tensor equal (no
    precision check is needed; the megatron-core engine's differ, see test_saved_run.py)."""
    src_cfg = tiny_cfg(save=str(tmp_path))
    src_cfg.mixed_precision = "bf16_mixed"
    src_cfg.finalize()
    assert src_cfg.optimizer.bf16 and src_cfg.model.params_dtype == "float32"
    src = build_run(src_cfg)
    train(src, 2)
    src.manager.save()
    assert {p.dtype for p in src.backend.parameters()} == {torch.float32}
    dst_cfg = tiny_cfg(load=str(tmp_path))
    dst_cfg.finalize()
    assert not dst_cfg.optimizer.bf16
    dst = build_run(dst_cfg, seed=5)
    assert dst.manager.load() and dst.state.step == 2
    assert all(torch.equal(a, b) for a, b in zip(full_weights(dst).values(), full_weights(src).values(), strict=True))
    src_state, dst_state = src.optimizer.state_dict()["state"], dst.optimizer.state_dict()["state"]
    assert src_state.keys() == dst_state.keys()
    for key, moments in src_state.items():
        for name, value in moments.items():
            assert value.dtype == dst_state[key][name].dtype and torch.equal(value, dst_state[key][name]), (key, name)
