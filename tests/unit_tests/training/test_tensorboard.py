"""TensorBoard tags under Megatron-Bridge's names and logger switches: the tag set of each switch combination (the
logger fed steps, and one real run of the training loop), the timers' levels and windows, and memory statistics."""

import dataclasses
import logging
import math
from pathlib import Path

import pytest
import torch

from megatron_bridge.config.logger import LoggerConfig
from megatron_bridge.recipes import tiny_llama_pretrain_config
from megatron_bridge.training import metrics as metrics_module
from megatron_bridge.training.metrics import StepMetrics, TrainingLogger
from megatron_bridge.training.tensorboard import (
    ALWAYS,
    CUDA_ONLY_TAGS,
    DISTILLATION_TAGS,
    MEMORY_KEYS,
    TENSORBOARD_TAGS,
    TensorBoardScalars,
    memory_report,
)
from megatron_bridge.training.timers import TIMER_LEVELS, PhaseTimers


CPU = torch.device("cpu")
SWITCHES = sorted({switch for switch, _ in TENSORBOARD_TAGS.values()} - {ALWAYS})
TWINNED = ("lm loss", "learning-rate", "batch-size", "grad-norm", "loss-scale", "world-size", "params-norm",
           "lm loss validation", "lm loss validation ppl")
"""Tags Megatron-Bridge also writes against consumed samples (``<tag> vs samples``)."""


def _events(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _expected(on: set[str], *, level: int = 0, evaluated: bool = True) -> set[str]:
    """The tags of :data:`TENSORBOARD_TAGS` the switches in ``on`` write on CPU (timers per ``level``)."""
    timer_tags = {f"{name}-time" for name, lvl in TIMER_LEVELS.items() if lvl <= level}
    if level >= 0:
        timer_tags.add("iteration-time")
    tags = set()
    for tag, (switch, _) in TENSORBOARD_TAGS.items():
        if tag in DISTILLATION_TAGS or tag in CUDA_ONLY_TAGS or (not evaluated and "validation" in tag):
            continue
        if tag.endswith("-time") and tag not in timer_tags:
            continue
        if switch == ALWAYS or switch in on:
            tags.add(tag)
    return tags | {f"{tag} vs samples" for tag in tags if tag in TWINNED}


def _config(tmp_path: Path, **switches: object):  # noqa: ANN202
    cfg = tiny_llama_pretrain_config(train_iters=4, global_batch_size=8, micro_batch_size=2, seq_length=64)
    cfg.logger = LoggerConfig(tensorboard_dir=str(tmp_path / "tb"), log_interval=2, log_progress=False, **switches)
    return cfg


def _feed(cfg, steps: int = 4) -> None:  # noqa: ANN001
    """Drive the logger as the loop does: ``steps`` steps (each entering every timer), then an evaluation."""
    log = TrainingLogger(cfg, CPU, world_size=1)
    for step in range(1, steps + 1):
        for name in TIMER_LEVELS:
            with log.timers(name):
                torch.ones(10).sum()
        log.log_step(StepMetrics(step, loss=2.0, grad_norm=1.5, lr=1e-3, step_time=0.01, tokens=512, flops=1e9,
                                 consumed_samples=8 * step, params_norm=3.0 if cfg.logger.log_params_norm else None))
    log.log_eval(steps, 2.5)
    log.close()


def _all_on() -> dict[str, object]:
    return {switch: True for switch in SWITCHES}


@pytest.mark.parametrize("on", [(), *((s,) for s in SWITCHES), tuple(SWITCHES)], ids=lambda on: "+".join(on) or "-")
def test_each_switch_writes_exactly_its_tags(tmp_path: Path, on: tuple[str, ...]) -> None:
    cfg = _config(tmp_path, throughput_window_size=2, **{s: (s in on) for s in SWITCHES})  # the rest off
    _feed(cfg)
    assert set(_events(tmp_path / "tb")) == _expected(set(on))


def test_megatron_bridge_defaults_write_losses_lr_batch_grad_norm_and_loss_scale(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001, E501
    """Default switches (Megatron-Bridge's): no timer, throughput, memory or world-size tags, and no collective."""
    reduced: list[list[float]] = []
    real = metrics_module.max_over_ranks
    monkeypatch.setattr(metrics_module, "max_over_ranks", lambda v, d: reduced.append(list(v)) or real(v, d))
    cfg = _config(tmp_path)
    _feed(cfg)
    events = _events(tmp_path / "tb")
    assert set(events) == _expected({"log_loss_scale_to_tensorboard"})
    assert events["lm loss vs samples"] == [(8, 2.0), (16, 2.0), (24, 2.0), (32, 2.0)]
    assert events["lm loss validation"] == [(4, 2.5)]
    assert all(values == [] for values in reduced)  # nothing to reduce over ranks at timing_log_level 0


@pytest.mark.parametrize("level", [-1, 0, 1, 2])
def test_timing_log_level_chooses_the_timer_tags(tmp_path: Path, level: int) -> None:
    cfg = _config(tmp_path, log_timers_to_tensorboard=True, timing_log_level=level, tensorboard_log_interval=2)
    _feed(cfg)
    events = _events(tmp_path / "tb")
    timer_tags = {tag for tag in events if tag.endswith("-time")}
    assert timer_tags == {t for t in _expected({"log_timers_to_tensorboard"}, level=level) if t.endswith("-time")}
    if level >= 0:
        assert [step for step, _ in events["iteration-time"]] == [2, 4]  # every log_interval steps
        assert events["iteration-time"][0][1] == pytest.approx(0.01)
    for tag in timer_tags - {"iteration-time"}:
        assert [step for step, _ in events[tag]] == [2, 4], tag  # every tensorboard_log_interval steps


def test_throughput_values(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    clock = iter([10.0, 10.5, 11.0, 11.5])  # one step every 0.5 s
    monkeypatch.setattr(metrics_module.time, "perf_counter", lambda: next(clock))
    cfg = _config(tmp_path, log_throughput_to_tensorboard=True, throughput_window_size=3)
    _feed(cfg)
    events = _events(tmp_path / "tb")
    assert [step for step, _ in events["throughput/batches_per_sec"]] == [3, 4]  # from window_size steps on
    assert events["throughput/batches_per_sec"][-1][1] == pytest.approx(2.0)
    assert events["throughput/samples_per_sec"][-1][1] == pytest.approx(16.0)
    assert events["throughput/tokens_per_sec"][-1][1] == pytest.approx(16.0 * 64)
    assert events["throughput/global_batch_size"][-1][1] == 8 and events["throughput/micro_batch_size"][-1][1] == 2
    assert events["throughput/tflops/device"] == [(2, pytest.approx(0.1)), (4, pytest.approx(0.1))]  # 1e9 / 0.01 s


def test_runtime_values(tmp_path: Path) -> None:
    cfg = _config(tmp_path, log_runtime_to_tensorboard=True, runtime_time_unit="seconds")
    _feed(cfg)
    events = _events(tmp_path / "tb")
    assert events["time/batches"] == [(1, 1), (2, 2), (3, 3), (4, 4)]  # train_iters 4
    assert events["time/samples"][-1] == (4, 32) and events["time/tokens"][-1] == (4, 32 * 64)
    assert events["time/remaining_estimate"][-1] == (4, 0.0)
    assert 0 <= events["time/total"][0][1] <= events["time/total"][-1][1] < 60


def test_skip_train_metrics_log_leaves_only_evaluation(tmp_path: Path) -> None:
    cfg = _config(tmp_path, skip_train_metrics_log=True, **_all_on())
    _feed(cfg)
    assert set(_events(tmp_path / "tb")) == {"lm loss validation", "lm loss validation vs samples",
                                             "lm loss validation ppl", "lm loss validation ppl vs samples"}


def test_training_loop_writes_every_switched_on_tag(tmp_path: Path) -> None:
    """Two real steps on the tiny Llama with every switch on and timing_log_level 2: the loop's timers measured."""
    from megatron_bridge.training.pretrain import pretrain

    cfg = tiny_llama_pretrain_config(train_iters=2, global_batch_size=2, micro_batch_size=1, seq_length=32,
                                     eval_interval=2, log_interval=2)
    cfg.validation.eval_iters = 1
    cfg.checkpoint.save = cfg.checkpoint.load = None
    cfg.logger = LoggerConfig(tensorboard_dir=str(tmp_path / "tb"), log_interval=2, log_progress=False,
                              timing_log_level=2, throughput_window_size=2, **_all_on())
    pretrain(cfg)
    events = _events(tmp_path / "tb")
    assert set(events) == _expected(set(SWITCHES), level=2)
    for name in TIMER_LEVELS:
        assert [step for step, _ in events[f"{name}-time"]] == [1, 2], name
        assert all(v > 0 and math.isfinite(v) for _, v in events[f"{name}-time"]), name
    fb, fwd, bwd = (events[f"{n}-time"][-1][1] for n in ("forward-backward", "forward-compute", "backward-compute"))
    assert fwd + bwd <= fb * 1.01
    assert events["memory/mem-max-allocated-gigabytes"][-1][1] >= events["memory/mem-allocated-gigabytes"][0][1] > 0
    assert events["world-size"] == [(1, 1.0), (2, 1.0)]


def test_phase_timers_levels_and_independent_readers() -> None:
    timers = PhaseTimers(1, CPU)
    assert timers.names == ["forward-backward", "optimizer"]
    with timers("batch-generator"):  # level 2: not measured
        pass
    with pytest.raises(KeyError, match="unknown timer"):
        timers("no-such-timer")
    for _ in range(2):
        with timers("optimizer"):
            torch.ones(100).sum()
        timers.end_step()
    first = timers.window("tensorboard")
    assert first["optimizer"] > 0 and first["forward-backward"] == 0.0
    assert timers.window("tensorboard")["optimizer"] == 0.0  # the window restarted ...
    assert timers.window("stdout") == first  # ... for that reader only
    assert PhaseTimers(0, CPU).names == [] and PhaseTimers(-1, CPU).names == []


def test_cuda_memory_report_at_its_boundary(monkeypatch) -> None:  # noqa: ANN001
    stats = {"allocated_bytes.all.current": 1_234_567_891, "reserved_bytes.all.peak": 2e9, "num_alloc_retries": 3,
             "allocation.all.current": 7}
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: stats)
    report = memory_report(torch.device("cuda", 0))
    assert set(report) == {name.replace("bytes", "gigabytes") for name in MEMORY_KEYS.values()}
    assert report["mem-allocated-gigabytes"] == 1.2346  # 5 significant digits
    assert report["mem-max-reserved-gigabytes"] == 2.0 and report["mem-alloc-retires"] == 3
    assert report["mem-active-gigabytes"] == 0.0  # a key torch does not report: 0, the same keys on every rank
    custom = memory_report(torch.device("cuda", 0), {"allocation.all.current": "allocs"})
    assert custom == {"allocs": 7}


def test_cpu_memory_report_is_the_resident_set() -> None:
    report = memory_report(CPU)
    assert set(report) == {"mem-allocated-gigabytes", "mem-max-allocated-gigabytes"}
    assert 0 < report["mem-allocated-gigabytes"] <= report["mem-max-allocated-gigabytes"] * 1.01
    assert memory_report(CPU, {"reserved_bytes.all.current": "r-bytes"}) == {}  # no value on CPU
    assert set(memory_report(CPU, {"allocated_bytes.all.peak": "rss-bytes"})) == {"rss-gigabytes"}


def test_cpu_peak_is_never_below_a_resident_size_already_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux's two counters are approximate (per-CPU batches): getrusage's peak can read below a resident size read
    from /proc/self/statm before it; the peak reported takes the higher. (getrusage is replaced: the kernel's lag
    cannot be forced.)"""
    import resource
    from types import SimpleNamespace

    first = memory_report(CPU)["mem-allocated-gigabytes"]
    monkeypatch.setattr(resource, "getrusage", lambda who: SimpleNamespace(ru_maxrss=1))  # 1 KiB: lagging behind
    assert memory_report(CPU)["mem-max-allocated-gigabytes"] >= first > 0


def test_every_tag_names_a_real_switch() -> None:
    fields = {f.name for f in dataclasses.fields(LoggerConfig)}
    assert set(SWITCHES) <= fields, set(SWITCHES) - fields
    assert set(CUDA_ONLY_TAGS) == {t for t in TENSORBOARD_TAGS if t.startswith("memory/")} - {
        "memory/mem-allocated-gigabytes", "memory/mem-max-allocated-gigabytes"}
    assert TensorBoardScalars.moe.__doc__ and "moe/load_balancing_loss" in TensorBoardScalars.moe.__doc__


def test_the_logging_page_lists_every_tag_and_switch() -> None:
    from tests.unit_tests.docs.doc_refs import REPO

    page = (REPO / "docs" / "training" / "logging.md").read_text()
    missing = [tag for tag in TENSORBOARD_TAGS if f"| `{tag}` |" not in page]
    missing += [f"logger.{f.name}" for f in dataclasses.fields(LoggerConfig)
                if "tensorboard" in f.name or f.name in SWITCHES or "timing" in f.name or "throughput" in f.name
                if f"`logger.{f.name}`" not in page]
    assert not missing, missing


def test_moe_tags_every_tensorboard_interval(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = _config(tmp_path, tensorboard_log_interval=2)
    log = TrainingLogger(cfg, CPU, world_size=1)
    stats = SimpleNamespace(aux_loss=0.5, layer_aux_loss={0: 0.2, 1: 0.3}, tokens_per_expert={0: [1.0, 3.0]})
    for step in (1, 2):
        log.log_moe(step, stats)
    log.close()
    events = _events(tmp_path / "tb")
    assert events["moe/load_balancing_loss"] == [(2, 0.5)]
    assert {t for t in events if t.startswith("moe/")} == {
        "moe/load_balancing_loss", "moe/load_balancing_loss/layer_00", "moe/load_balancing_loss/layer_01",
        "moe/max_over_mean_load/layer_00"}
    assert events["moe/max_over_mean_load/layer_00"] == [(2, 1.5)]  # 3 / mean(1, 3)
    histograms = EventAccumulator(str(tmp_path / "tb"))
    histograms.Reload()
    assert histograms.Tags()["histograms"] == ["moe/tokens_per_expert/layer_00"]


def test_mtp_losses_are_written_under_megatron_core_tags(tmp_path: Path, caplog) -> None:  # noqa: ANN001
    """Multi-token prediction's per-depth losses: ``mtp_1 loss``, ``mtp_2 loss`` in TensorBoard every step and on the
    stdout line (mean over the log interval)."""
    cfg = _config(tmp_path)
    log = TrainingLogger(cfg, CPU, world_size=1)
    with caplog.at_level(logging.INFO):
        for step in (1, 2):
            log.log_step(StepMetrics(step, loss=2.0, grad_norm=1.5, lr=1e-3, step_time=0.01, tokens=512, flops=1e9,
                                     consumed_samples=8 * step,
                                     mtp_losses={"mtp_1 loss": 3.0 + step, "mtp_2 loss": 5.0}))
    log.close()
    events = _events(tmp_path / "tb")
    assert events["mtp_1 loss"] == [(1, 4.0), (2, 5.0)] and events["mtp_2 loss"] == [(1, 5.0), (2, 5.0)]
    line = next(r.getMessage() for r in caplog.records if "iteration" in r.getMessage())
    assert "mtp_1 loss 4.500000e+00" in line and "mtp_2 loss 5.000000e+00" in line
