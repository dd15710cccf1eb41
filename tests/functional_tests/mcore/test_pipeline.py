"""Pipeline parallelism on the megatron-core engine (megatron-core's own schedules) on CPU/gloo, through the test-only
harness (tests/functional_tests/mcore_cpu_harness.py), with cross-engine parity.

A one-process megatron-core run (PP=1) is the reference: its initial weights, per-step losses and final validation
loss. Every pipelined run starts from those weights — cut per stage by
:mod:`megatron_bridge.engines.megatron_core.weights`
(each megatron-core stage's layers found from its own ``layer_number``), or mapped to native names for the native
engine — and trains on the same data; its per-step and validation losses must equal the reference's within
:data:`LOSS_ATOL` (fp32; measured differences are ~1e-7):

* megatron-core PP=2 (1F1B) and PP=2 × VP=2 (interleaved 1F1B, ``batch_p2p_comm`` forced off) with megatron-core DDP,
  and the native engine (torch.distributed.pipelining) at the same layouts: cross-engine parity under PP;
* the same two megatron-core layouts with the distributed optimizer; and PP=2 × DP=2 with it on 4 ranks;
* uneven splits mapped to megatron-core's fields (``num_layers_in_first_pipeline_stage``, the embedding and loss
  counted as layers over PP=2 × VP=3);
* an explicit ``pipeline_model_parallel_layout`` (embedding-only first and loss-only last stage) on both engines;
* tied embeddings (the native engine refuses them under PP): PP=2 and PP=2 × VP=2 against a DP=2 run of the same
  launch from the same weights (DP=2 equals one process: tests/functional_tests/training/test_megatron_core_engine.py);
* a custom 3-argument forward step ``(state, data_iterator, model)`` under megatron-core's schedule;
* TP=2 × PP=2 on 4 ranks (the reference's weights split over TP as megatron-core shards them);
* ``run_recipe.py --recipe tiny_llama --nproc 2 model.engine=megatron_core`` at PP=2 × VP=2 trains, evaluates and
  logs the ``batch_p2p_comm`` adjustment.

The tests of one process count share one torchrun launch (launcher.py's ``LaunchGroups``). Skipped with CUDA (the
harness replaces CUDA calls) and without megatron-core.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.training.callbacks import Callback
from tests.functional_tests.launcher import REPO_ROOT, LaunchGroups, is_worker, launch, selected_groups
from tests.functional_tests.mcore_cpu_harness import workers_env
from tests.functional_tests.training._common import assert_finite_decreasing, small_config


pytest.importorskip("megatron.core", reason="the megatron-core engine needs megatron-core (Python 3.12 environment)")

LOSS_ATOL = 1e-5
STEPS = 4
GROUPS: dict[int, list[str]] = {
    2: ["test_pp2_1f1b", "test_pp2_vpp2_interleaved", "test_distributed_optimizer", "test_uneven_splits",
        "test_explicit_layout", "test_tied_embeddings"],
    4: ["test_pp2_dp2_distributed_optimizer", "test_tp2_pp2"],
}
"""Tests launched together, by process count (one launch each)."""
LAUNCH_TIMEOUT_S = {2: 600, 4: 420}

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.timeout(900),
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU harness test (megatron-core runs natively on CUDA)"),
]


def pp_config(engine: str = "megatron_core", **overrides: Any) -> ConfigContainer:
    """The tiny Llama (4 layers, untied embeddings) for ``STEPS`` steps of 8 samples in micro-batches of 2, one
    validation batch at the end; vocabulary padded to 512; ``overrides`` by dotted path."""
    cfg = small_config(train_iters=STEPS, eval_interval=STEPS)
    cfg.model.engine = engine
    cfg.model.vocab_size, cfg.model.make_vocab_size_divisible_by = 512, 128
    cfg.validation.eval_iters = 1
    cfg.logger.log_interval = 1
    for path, value in overrides.items():
        section, name = path.split(".")
        setattr(getattr(cfg, section), name, value)
    return cfg


class StartFrom(Callback):
    """At the start of training: records the whole model's weights (``weights is None``, one chunk, megatron-core
    names) or loads ``weights`` (a whole megatron-core state dict) into every chunk, cut per stage."""

    def __init__(self, weights: dict[str, torch.Tensor] | None = None) -> None:
        self.weights = weights
        self.recorded: dict[str, torch.Tensor] = {}

    def on_train_start(self, ctx: Any) -> None:
        if self.weights is None:
            model = ctx.backend.unwrap(ctx.backend.chunks[0])
            self.recorded = {k: v.detach().clone() for k, v in model.state_dict().items()
                             if not k.endswith("_extra_state")}
            return
        for chunk in ctx.backend.chunks:
            if ctx.cfg.model.engine == "megatron_core":
                _load_megatron_core_stage(ctx.backend.unwrap(chunk), self.weights,
                                          ctx.cfg.model.share_embeddings_and_output_weights)
            else:
                _load_native_stage(chunk, self.weights, ctx.cfg)


def _load_megatron_core_stage(model: torch.nn.Module, weights: dict[str, torch.Tensor], tied: bool) -> None:
    from megatron_bridge.engines.megatron_core.weights import megatron_core_stage_state

    layers = [layer.layer_number - 1 for layer in model.decoder.layers]
    state = megatron_core_stage_state(weights, layers, pre_process=model.pre_process,
                                      post_process=model.post_process, tied=tied)
    state = {k: _tp_shard(k, v, model.state_dict()[k]) for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)


def _tp_shard(name: str, full: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """This tensor-parallel rank's part of a full megatron-core weight (its local shape tells the split dimension):
    column-parallel weights split rows (the fused gate/up ``linear_fc1`` splits each half), row-parallel weights
    columns, the vocabulary rows; norms are whole."""
    from megatron.core import parallel_state as ps

    if full.shape == local.shape:
        return full
    tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    if name.endswith("mlp.linear_fc1.weight"):
        return torch.cat([half.chunk(tp)[rank] for half in full.chunk(2)])
    dim = next(d for d in range(full.dim()) if full.shape[d] != local.shape[d])
    return full.chunk(tp, dim=dim)[rank]


def _load_native_stage(chunk: torch.nn.Module, weights: dict[str, torch.Tensor], cfg: ConfigContainer) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    from megatron_bridge.engines.megatron_core.weights import megatron_core_to_native

    mapped = megatron_core_to_native(weights, cfg.model)
    own = get_model_state_dict(chunk, options=StateDictOptions(full_state_dict=True))
    assert set(own) <= set(mapped), sorted(set(own) - set(mapped))
    set_model_state_dict(chunk, {k: mapped[k] for k in own}, options=StateDictOptions(full_state_dict=True))


# ------------------------------------------------------------------------------------------------ the reference
@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The one-process megatron-core run (a 1-rank torchrun job: the harness patches its process)."""
    if is_worker():
        return None
    path = tmp_path_factory.mktemp("mcore_pp_reference") / "reference.pt"
    launch(f"{__file__}::test_reference_trains", nproc=1, env={"MB_REFERENCE": str(path)})
    return path


def test_reference_trains(reference: Path | None) -> None:
    """The reference (megatron-core, PP=1) trains: its losses fall."""
    if not is_worker():
        ref = torch.load(reference, weights_only=True)  # type: ignore[arg-type]
        assert_finite_decreasing(ref["losses"].tolist(), min_drop=0.02)
        return
    from megatron_bridge.training.pretrain import pretrain
    from tests.functional_tests.mcore_cpu_harness import install

    install()
    start = StartFrom()
    result = pretrain(pp_config(), callbacks=[start])
    assert result.final_step == STEPS and len(result.eval_losses) == 1
    torch.save({"losses": torch.tensor(result.losses, dtype=torch.float64),
                "eval": torch.tensor(list(result.eval_losses.values()), dtype=torch.float64),
                "weights": start.recorded}, os.environ["MB_REFERENCE"])


# ------------------------------------------------------------------------------------------- the pipelined runs
@pytest.fixture(scope="module")
def launches(reference: Path | None, request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The module's launches (launching process only), running the tests this session selected."""
    if is_worker():
        return None
    groups = selected_groups(request, GROUPS)
    return LaunchGroups(__file__, groups, LAUNCH_TIMEOUT_S, env={"MB_REFERENCE": str(reference)})


def train(engine: str, callbacks: list[Callback], forward_step: Any = None, **overrides: Any) -> Any:
    """Worker: ``pretrain(pp_config(engine, **overrides))`` on this launch's ranks (one process group for the whole
    launch, megatron-core's groups kept while the layout stays: pretrain_in_launch); returns (result, finalized
    config)."""
    from tests.functional_tests.mcore_cpu_harness import install, pretrain_in_launch

    install()
    cfg = pp_config(engine, **overrides)
    return pretrain_in_launch(cfg, callbacks, forward_step), cfg


def run_and_compare(label: str, engine: str = "megatron_core", ref: dict[str, Any] | None = None,
                    forward_step: Any = None, **overrides: Any) -> ConfigContainer:
    """Worker: train ``pp_config(engine, **overrides)`` from the reference's weights (``ref``, default the
    one-process reference); its losses must equal the reference's. Returns the finalized config."""
    ref = ref if ref is not None else torch.load(os.environ["MB_REFERENCE"], weights_only=True)
    result, cfg = train(engine, [StartFrom(ref["weights"])], forward_step, **overrides)
    assert result.final_step == STEPS
    want, want_eval = ref["losses"].tolist(), ref["eval"].tolist()
    for got, expected in zip(result.losses, want, strict=True):
        assert abs(got - expected) <= LOSS_ATOL, (label, result.losses, want)
    for got, expected in zip(result.eval_losses.values(), want_eval, strict=True):
        assert abs(got - expected) <= LOSS_ATOL, (label, result.eval_losses, want_eval)
    if dist.get_rank() == 0:
        diff = max(abs(a - b) for a, b in zip(result.losses, want, strict=True))
        print(f"[mcore-pp] {label}: losses {json.dumps(result.losses)}, max |Δ| vs reference {diff:.2e}")
    return cfg


_STEP_CALLS: list[Any] = []


def state_forward_step(state: Any, data_iterator: Any, model: torch.nn.Module,
                       return_schedule_plan: bool = False) -> Any:
    """A custom forward step in Megatron-Bridge's 4-argument form: records its ``state``, then runs the native
    model's step (``model(tokens, position_ids=..., labels=...)``), which megatron-core's chunks accept
    (engines/megatron_core/forward_step.py::accept_native_call)."""
    from megatron_bridge.training.gpt_step import forward_step

    _STEP_CALLS.append((state, return_schedule_plan))
    return forward_step(data_iterator, model)


def test_pp2_1f1b(launches: LaunchGroups | None) -> None:
    """megatron-core PP=2 (1F1B; a custom 4-argument forward step of the native model's form) and the native engine
    at PP=2 give the one-process losses from the same weights."""
    if not is_worker():
        launches.check("test_pp2_1f1b")  # type: ignore[union-attr]
        return
    from megatron_bridge.training.pretrain import TrainingContext

    run_and_compare("megatron-core PP2 1F1B, custom forward step", forward_step=state_forward_step,
                    **{"model.pipeline_model_parallel_size": 2})
    assert _STEP_CALLS and all(isinstance(s, TrainingContext) and not plan for s, plan in _STEP_CALLS)
    run_and_compare("native PP2 1F1B", engine="native", **{"model.pipeline_model_parallel_size": 2})


def test_pp2_vpp2_interleaved(launches: LaunchGroups | None) -> None:
    """megatron-core PP=2 × VP=2 (interleaved 1F1B; finalize() turned batch_p2p_comm off) and the native engine at
    PP=2 × VP=2 give the one-process losses from the same weights."""
    if not is_worker():
        launches.check("test_pp2_vpp2_interleaved")  # type: ignore[union-attr]
        return
    layout = {"model.pipeline_model_parallel_size": 2, "model.virtual_pipeline_model_parallel_size": 2}
    cfg = run_and_compare("megatron-core PP2 VP2 interleaved", **layout)
    assert cfg.model.batch_p2p_comm is False
    run_and_compare("native PP2 VP2 Interleaved1F1B", engine="native", **layout)


def test_distributed_optimizer(launches: LaunchGroups | None) -> None:
    """megatron-core's distributed optimizer under PP=2 and PP=2 × VP=2 (with overlapped P2P communication)."""
    if not is_worker():
        launches.check("test_distributed_optimizer")  # type: ignore[union-attr]
        return
    dist_opt = {"optimizer.use_distributed_optimizer": True, "model.pipeline_model_parallel_size": 2}
    run_and_compare("megatron-core PP2 distributed optimizer", **dist_opt)
    run_and_compare("megatron-core PP2 VP2 distributed optimizer, overlap_p2p_comm", **dist_opt,
                    **{"model.virtual_pipeline_model_parallel_size": 2, "model.overlap_p2p_comm": True})


def test_uneven_splits(launches: LaunchGroups | None) -> None:
    """Uneven stages through megatron-core's own fields: 1 + 3 layers, and the embedding and the loss counted as
    layers over PP=2 × VP=3 (the first stage holds only the embedding, the last only the output layer)."""
    if not is_worker():
        launches.check("test_uneven_splits")  # type: ignore[union-attr]
        return
    run_and_compare("megatron-core PP2 first=1", **{"model.pipeline_model_parallel_size": 2,
                                                    "model.num_layers_in_first_pipeline_stage": 1})
    run_and_compare("megatron-core PP2 VP3 account_for_embedding/loss",
                    **{"model.pipeline_model_parallel_size": 2, "model.virtual_pipeline_model_parallel_size": 3,
                       "model.account_for_embedding_in_pipeline_split": True,
                       "model.account_for_loss_in_pipeline_split": True})


def test_explicit_layout(launches: LaunchGroups | None) -> None:
    """model.pipeline_model_parallel_layout "E|tt|tt|L" at PP=2 × VP=2, passed to megatron-core's TransformerConfig
    (stage 0 only the embedding, stage 3 only the output layer and loss), and the native engine at the same layout."""
    if not is_worker():
        launches.check("test_explicit_layout")  # type: ignore[union-attr]
        return
    layout = {"model.pipeline_model_parallel_size": 2, "model.virtual_pipeline_model_parallel_size": 2,
              "model.pipeline_model_parallel_layout": "E|tt|tt|L"}
    run_and_compare("megatron-core PP2 VP2 layout E|tt|tt|L", **layout)
    run_and_compare("native PP2 VP2 layout E|tt|tt|L", engine="native", **layout)


def test_tied_embeddings(launches: LaunchGroups | None) -> None:
    """Tied embeddings: megatron-core PP=2 and PP=2 × VP=2 (the last stage's copy of the embedding, its gradient
    all-reduced with the first stage's) give the losses of a DP=2 run from the same weights."""
    if not is_worker():
        launches.check("test_tied_embeddings")  # type: ignore[union-attr]
        return
    tied = {"model.share_embeddings_and_output_weights": True}
    start = StartFrom()
    result, _ = train("megatron_core", [start], **tied)
    assert_finite_decreasing(result.losses, min_drop=0.02)
    ref = {"losses": torch.tensor(result.losses), "eval": torch.tensor(list(result.eval_losses.values())),
           "weights": start.recorded}
    assert "output_layer.weight" not in start.recorded  # one stage: the output layer uses the embedding
    run_and_compare("megatron-core PP2 tied embeddings", ref=ref, **tied,
                    **{"model.pipeline_model_parallel_size": 2})
    run_and_compare("megatron-core PP2 VP2 tied embeddings", ref=ref, **tied,
                    **{"model.pipeline_model_parallel_size": 2, "model.virtual_pipeline_model_parallel_size": 2})


def test_pp2_dp2_distributed_optimizer(launches: LaunchGroups | None) -> None:
    """4 ranks: megatron-core PP=2 × VP=2 × DP=2 with the distributed optimizer sharding over the data-parallel pair
    and the gradient reduction overlapped (each chunk's start_grad_sync is the schedule's grad_sync_func)."""
    if not is_worker():
        launches.check("test_pp2_dp2_distributed_optimizer")  # type: ignore[union-attr]
        return
    run_and_compare("megatron-core PP2 VP2 DP2 distributed optimizer, overlap_grad_reduce", **{
        "model.pipeline_model_parallel_size": 2, "optimizer.use_distributed_optimizer": True,
        "model.virtual_pipeline_model_parallel_size": 2, "ddp.overlap_grad_reduce": True})


def test_tp2_pp2(launches: LaunchGroups | None) -> None:
    """4 ranks: megatron-core TP=2 × PP=2 from the reference's weights (split over TP). (Sequence parallelism needs
    Apex or transformer-engine norms in megatron-core: rule megatron_core_sequence_parallel.)"""
    if not is_worker():
        launches.check("test_tp2_pp2")  # type: ignore[union-attr]
        return
    run_and_compare("megatron-core TP2 PP2", **{"model.pipeline_model_parallel_size": 2,
                                                "model.tensor_model_parallel_size": 2})


def test_run_recipe_trains_pp2_vpp2_on_megatron_core() -> None:
    """``run_recipe.py --recipe tiny_llama --nproc 2 model.engine=megatron_core`` at PP=2 × VP=2: megatron-core's
    interleaved schedule trains and evaluates, and finalize() logs turning batch_p2p_comm off (the harness enters
    the torchrun workers through tests/functional_tests/mcore_cpu/sitecustomize.py)."""
    if is_worker():
        pytest.skip("launches run_recipe.py itself")
    env = {**os.environ, **workers_env()}
    cmd = [sys.executable, "scripts/training/run_recipe.py", "--recipe", "tiny_llama", "--nproc", "2",
           "model.engine=megatron_core", "model.pipeline_model_parallel_size=2",
           "model.virtual_pipeline_model_parallel_size=2", "train.train_iters=4", "train.global_batch_size=8",
           "train.micro_batch_size=2", "validation.eval_iters=1", "scheduler.lr_warmup_iters=1",
           "scheduler.lr_warmup_fraction=null"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=420)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "megatron-core parallel state: TP 1, PP 2, CP 1, DP 1" in output, output[-4000:]
    assert "forward_backward_pipelining_with_interleaving over 4 stages (2 per rank)" in output, output[-4000:]
    assert "set model.batch_p2p_comm=False (was True)" in output and "NVIDIA/Megatron-LM#750" in output
    done = [line for line in output.splitlines() if line.startswith("done: at step 4 (train_iters)")]
    assert done, output[-4000:]
    first, last = (float(x) for x in done[0].split("loss ")[1].split(";")[0].split(" -> "))
    assert last < first, done[0]
    assert "validation loss at iteration 4" in output, output[-4000:]
