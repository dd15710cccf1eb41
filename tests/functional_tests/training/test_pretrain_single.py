"""pretrain() in one process: gradient accumulation equals the large batch, exits, NaN detection, logging."""

import math

import pytest
import torch

from megatron_bridge.errors import TrainingError
from megatron_bridge.training.pretrain import pretrain
from tests.functional_tests.training._common import FullWeights, max_weight_diff, small_config


pytestmark = pytest.mark.timeout(300)


def test_gradient_accumulation_equals_large_batch() -> None:
    small, large = FullWeights(), FullWeights()
    accumulated = pretrain(small_config(micro_batch_size=2), callbacks=[small])  # 4 micro-batches per step
    single = pretrain(small_config(micro_batch_size=8), callbacks=[large])  # 1 micro-batch per step
    assert accumulated.losses == pytest.approx(single.losses, rel=1e-5)
    assert max_weight_diff(small.weights, large.weights) <= 2e-5


def test_token_weighted_accumulation_with_masked_eod_tokens() -> None:
    """With eod_mask_loss the micro-batches hold different token counts: the step is still the large batch's."""
    small, large = FullWeights(), FullWeights()
    accumulated = pretrain(_eod_masked(small_config(micro_batch_size=2)), callbacks=[small])
    single = pretrain(_eod_masked(small_config(micro_batch_size=8)), callbacks=[large])
    assert accumulated.losses == pytest.approx(single.losses, rel=1e-5)
    assert max_weight_diff(small.weights, large.weights) <= 2e-5


def _eod_masked(cfg):  # noqa: ANN001, ANN202
    cfg.dataset.eod_mask_loss = True
    return cfg


def test_exit_interval_and_tensorboard(tmp_path) -> None:
    cfg = small_config(train_iters=8, log_interval=2)
    cfg.train.exit_interval = 3
    cfg.logger.tensorboard_dir = str(tmp_path / "tb")
    result = pretrain(cfg)
    assert result.final_step == 3 and result.exit_reason == "exit_interval"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    from megatron_bridge.training.tensorboard import CUDA_ONLY_TAGS, DISTILLATION_TAGS, TENSORBOARD_TAGS

    # the tiny recipe's switches: timers (level 0), throughput (its rolling window is 100 steps) and memory
    not_here = {"params-norm", "world-size", *DISTILLATION_TAGS, *CUDA_ONLY_TAGS}
    off = {t for t, (switch, _) in TENSORBOARD_TAGS.items() if getattr(cfg.logger, switch, True) is False}
    assert {"time/total", "time/batches"} <= off  # log_runtime_to_tensorboard: Megatron-Bridge's default False
    assert not off & tags, off & tags
    cpu_tags = {t for t, (switch, _) in TENSORBOARD_TAGS.items() if t not in not_here | off and "validation" not in t
                and not (t.endswith("-time") and t != "iteration-time") and "_per_sec" not in t
                and not t.endswith("batch_size")}
    assert cpu_tags <= tags, cpu_tags - tags  # Megatron-Bridge's tag names
    for tag in ("lm loss", "learning-rate", "batch-size", "loss-scale", "grad-norm"):
        assert f"{tag} vs samples" in tags, tag
    assert [e.step for e in events.Scalars("lm loss vs samples")] == [8, 16, 24]  # 8 samples per step
    assert [e.value for e in events.Scalars("batch-size")] == [8, 8, 8]
    assert [e.step for e in events.Scalars("iteration-time")] == [2]  # every log_interval steps
    assert events.Scalars("throughput/tflops/device")[-1].value > 0
    assert events.Scalars("memory/mem-max-allocated-gigabytes")[-1].value > 0
    assert [e.step for e in events.Scalars("lm loss")] == [1, 2, 3]
    assert all(math.isfinite(e.value) for e in events.Scalars("lm loss"))


def test_distillation_tensorboard(tmp_path) -> None:
    """A distillation run writes every distillation tag of TENSORBOARD_TAGS, and the plain tags beside them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from megatron_bridge.training.tensorboard import DISTILLATION_TAGS, TENSORBOARD_TAGS

    teacher = small_config(train_iters=1, global_batch_size=2)
    teacher.checkpoint.save = str(tmp_path / "teacher")
    pretrain(teacher)
    cfg = small_config(train_iters=2, global_batch_size=2)
    cfg.distillation.teacher_checkpoint = str(tmp_path / "teacher")
    cfg.distillation.intermediate_layer_pairs = [["norm", "norm"]]
    cfg.distillation.skip_lm_loss = False
    cfg.logger.tensorboard_dir = str(tmp_path / "tb")
    pretrain(cfg)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert set(DISTILLATION_TAGS) <= set(TENSORBOARD_TAGS) and set(DISTILLATION_TAGS) <= tags, tags
    assert {"lm loss", "total loss vs samples", "grad-norm"} <= tags
    for tag in DISTILLATION_TAGS:
        assert [e.step for e in events.Scalars(tag)] == [1, 2] and all(math.isfinite(e.value)
                                                                         for e in events.Scalars(tag)), tag


def test_eval_runs_on_schedule() -> None:
    result = pretrain(small_config(train_iters=4, eval_interval=2))
    assert sorted(result.eval_losses) == [2, 4]
    assert all(math.isfinite(v) for v in result.eval_losses.values())


def test_nan_loss_stops_with_named_error() -> None:
    def nan_step(data_iterator, model):  # noqa: ANN001, ANN202
        batch = next(data_iterator)
        out = model(batch["tokens"], labels=batch["labels"]) * float("nan")
        return out, lambda o: (o.sum(), torch.tensor(float(o.numel())), {})

    with pytest.raises(TrainingError, match="training loss is nan at iteration 1"):
        pretrain(small_config(train_iters=3), nan_step)
    # the aborted groups stay referenced until the next start, not released with the traceback (whose DDP reducer
    # would run gloo's destructor, which can deadlock on the GIL: distributed/init.py's _RETIRED_GROUPS)
    from megatron_bridge.distributed import init

    assert init._RETIRED_GROUPS


def test_learning_rate_schedule_is_applied() -> None:
    result = pretrain(small_config(train_iters=6, lr_warmup_iters=2))
    lrs = result.learning_rates
    assert lrs[0] == pytest.approx(0.0) and lrs[2] == pytest.approx(1e-3)  # warmup 0 -> peak at step 2
    assert lrs[-1] < lrs[2]  # cosine decay afterwards


def test_profiler_trace_for_the_step_window(tmp_path) -> None:
    cfg = small_config(train_iters=4)
    p = cfg.profiling
    p.use_pytorch_profiler, p.profile_step_start, p.profile_step_end, p.trace_dir = True, 1, 3, str(tmp_path)
    pretrain(cfg)
    trace = (tmp_path / "trace_rank0.json").read_text()
    assert '"traceEvents"' in trace and "aten::mm" in trace


def test_params_norm_is_logged_and_correct() -> None:
    class Norms(FullWeights):
        def __init__(self) -> None:
            super().__init__()
            self.logged: list[float] = []

        def on_train_step_end(self, ctx) -> None:  # noqa: ANN001
            self.logged.append(ctx.step_metrics.params_norm)

    cfg = small_config(train_iters=3)
    cfg.logger.log_params_norm = True
    cb = Norms()
    pretrain(cfg, callbacks=[cb])
    expected = torch.linalg.vector_norm(torch.stack([w.float().norm() for w in cb.weights.values()]))
    assert cb.logged[-1] == pytest.approx(float(expected), rel=1e-6)
