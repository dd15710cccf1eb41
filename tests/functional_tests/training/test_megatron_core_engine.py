"""The megatron-core engine (``model.engine="megatron_core"``) end to end on CPU/gloo through the test-only harness
(tests/functional_tests/mcore_cpu_harness.py): ``GPTModel`` chunks, megatron-core DDP and optimizer inside
``pretrain()``.

* 2 ranks match one process: TP=2, and DP=2 under megatron-core DDP with the distributed optimizer and with overlapped
  gradient reduction — per-step losses within 1e-5 (relative) of the one-process megatron-core run.
* MoE (:data:`MOE`): megatron-core's ``MoELayer`` at EP=2 (DP 2) and at PP=2 matches its one-process run, and the native
  engine from its initial weights matches it (absolute 1e-5).
* Cross-engine parity: the native engine trained from the megatron-core model's initial weights (mapped by
  :mod:`megatron_bridge.engines.megatron_core.weights`) gives the same per-step losses (absolute 1e-5) as
  megatron-core at TP=1
  and TP=2 (TP=2 builds the same initial weights as TP=1), and with tiny_mistral's sliding window
  (``window_size=(31, 0)`` on 64-token sequences, in every layer and with ``window_attn_skip_freq=2``): megatron-core's
  local attention builds its window mask (``get_sliding_window_causal_mask``) on the CPU through the harness.
* ``run_recipe.py --recipe tiny_llama model.engine=megatron_core`` trains (2 ranks: TP=2 with megatron-core DDP, and
  DP=2 with ``dist.use_megatron_fsdp=true``), the harness installed in its torchrun workers by
  ``tests/functional_tests/mcore_cpu/sitecustomize.py`` (the workers fork warm: mcore_cpu_harness.py's
  ``workers_env``).

The vocabulary is padded to 512 under every layout (``make_vocab_size_divisible_by`` × TP), so all layouts build the
same model. Skipped with CUDA (the harness replaces CUDA calls) and without megatron-core (Python < 3.12).

Launches: the one-process reference is a 1-rank torchrun job; the 2-rank layouts share one launch (``GROUPS``,
launcher.py's ``LaunchGroups``; each stays a test of its own) on one process group, megatron-core's groups destroyed
after each run.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from megatron_bridge.training.callbacks import Callback
from tests.functional_tests.launcher import REPO_ROOT, LaunchGroups, is_worker, launch, selected_groups
from tests.functional_tests.mcore_cpu_harness import workers_env
from tests.functional_tests.training._common import assert_finite_decreasing, small_config


pytest.importorskip("megatron.core", reason="the megatron-core engine needs megatron-core (Python 3.12 environment)")

LOSS_RTOL = 1e-5
CROSS_ENGINE_ATOL = 1e-5
PADDED_VOCAB = 512
LAYOUTS: dict[str, dict[str, Any]] = {
    "tp2": {"model.tensor_model_parallel_size": 2},
    "dp2_distributed_optimizer": {"optimizer.use_distributed_optimizer": True, "ddp.use_distributed_optimizer": True},
    "dp2_overlap_grad_reduce": {"ddp.overlap_grad_reduce": True},
}
WINDOWS: dict[str, dict[str, Any]] = {
    "every_layer": {"model.window_size": [31, 0]},
    "skip_freq_2": {"model.window_size": [31, 0], "model.window_attn_skip_freq": 2},
}
"""Sliding-window cases of the cross-engine parity check (trained in the reference job): a 32-token window on
64-token sequences in every layer (tiny_mistral's), and in layers 1 and 3 only (every 2nd layer full)."""
WINDOW_EFFECT = 1e-3
"""Least largest per-step loss difference (over 8 steps) between a windowed megatron-core run and the full-attention
reference, which starts from the same initial weights (the same seed; a window adds no parameter): the window changes
the model (measured 2026-12-07: 2.9e-2 in every layer, 1.6e-2 with
skip_freq 2)."""
MOE: dict[str, Any] = {"model.family": "qwen3_moe", "model.qk_layernorm": True, "model.num_moe_experts": 4,
                       "model.moe_router_topk": 2, "model.moe_ffn_hidden_size": 64, "model.moe_aux_loss_coeff": 1e-2,
                       "model.moe_z_loss_coeff": 1e-3}
"""The tiny Qwen3-MoE of the MoE cases (the tiny Llama's sizes with q/k norms): 4 routed experts of width 64 in
every layer (top-2, softmax over the selected logits), load-balancing and z losses: megatron-core's ``MoELayer``
(router, ``SequentialMLP`` experts, all-to-all dispatcher). The shared expert's map is checked in
tests/unit_tests/models/test_megatron_core_weights.py."""
MOE_LAYOUTS: dict[str, dict[str, Any]] = {"moe_ep2": {**MOE, "model.expert_model_parallel_size": 2},
                                          "moe_pp2": {**MOE, "model.pipeline_model_parallel_size": 2}}
"""2-rank MoE layouts, compared with the one-process MoE reference: EP=2 (DP 2), and PP=2 (the aux losses' gradient
scale set by megatron-core's 1F1B schedule); megatron-core draws weights per EP rank and stage, so they start from the
reference's initial weights (:class:`ReferenceWeights`)."""
LAYOUTS.update(MOE_LAYOUTS)
GROUPS: dict[int, list[str]] = {2: [f"test_two_ranks_match_one_process[{name}]" for name in sorted(LAYOUTS)]}
"""The 2-rank layouts, launched together."""

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.timeout(600),
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU harness test (megatron-core runs natively on CUDA)"),
]


def mcore_config(**overrides: Any) -> Any:
    """The functional tests' small tiny-Llama config on the megatron-core engine with ``overrides`` (dotted paths);
    the vocabulary padded to :data:`PADDED_VOCAB` whatever the TP size."""
    cfg = small_config()
    cfg.model.engine = "megatron_core"
    tp = int(overrides.get("model.tensor_model_parallel_size", 1))
    cfg.model.make_vocab_size_divisible_by = PADDED_VOCAB // tp
    cfg = cfg.apply_overrides(None, [f"{k}={json.dumps(v)}" for k, v in overrides.items()])
    assert cfg.model.padded_vocab_size == PADDED_VOCAB
    return cfg


class InitialWeights(Callback):
    """At the start of training: records the unwrapped model's state dict (``record``) or loads ``load`` into it."""

    def __init__(self, load: dict[str, torch.Tensor] | None = None) -> None:
        self.load = load
        self.weights: dict[str, torch.Tensor] = {}

    def on_train_start(self, ctx: Any) -> None:
        model = ctx.backend.unwrap(ctx.backend.chunks[0])
        if self.load is not None:
            model.load_state_dict(self.load, strict=True)
        self.weights = {k: v.detach().clone() for k, v in model.state_dict().items() if not k.endswith("_extra_state")}


class StepEnds(Callback):
    """Megatron-Bridge's ``on_train_step_end`` on this engine: the step's loss, once per step."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_step_end(self, context: Any) -> None:
        assert context.state.cfg.model.engine == "megatron_core" and context.optimizer is not None
        self.losses.append(float(context.loss_dict["lm loss"]))


class ReferenceWeights(Callback):
    """At the start of training (TP = 1): loads a one-process megatron-core state dict into this rank's chunk: its
    pipeline stage's layers (:func:`~megatron_bridge.engines.megatron_core.weights.megatron_core_stage_state`), this
    EP rank's routed experts (``local_experts.<global id>`` there, ``local_experts.<local id>`` here; experts are
    whole with ETP 1) and every other weight as it is (megatron-core draws expert weights per EP rank, and each
    stage's from its own generator state, so they differ from the one-process model's)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_start(self, ctx: Any) -> None:
        from megatron.core import parallel_state as ps

        from megatron_bridge.engines.megatron_core.weights import megatron_core_stage_state

        model = ctx.backend.unwrap(ctx.backend.chunks[0])
        layers = [layer.layer_number - 1 for layer in model.decoder.layers]
        full = megatron_core_stage_state(torch.load(self.path, weights_only=True), layers,
                                         pre_process=model.pre_process, post_process=model.post_process)
        per_rank = MOE["model.num_moe_experts"] // ps.get_expert_model_parallel_world_size()
        offset = ps.get_expert_model_parallel_rank() * per_rank
        weights = {}
        for key in model.state_dict():
            if key.endswith("_extra_state"):
                continue
            if ".local_experts." in key:
                head, tail = key.split(".local_experts.")
                local, rest = tail.split(".", 1)
                weights[key] = full[f"{head}.local_experts.{offset + int(local)}.{rest}"]
            else:
                weights[key] = full[key]
        model.load_state_dict(weights, strict=False)  # strict but for the _extra_state entries
        for key, value in model.state_dict().items():
            assert key.endswith("_extra_state") or torch.equal(value, weights[key]), key


def megatron_core_and_native(overrides: dict[str, Any], save_initial: str | None = None) -> dict[str, list[float]]:
    """One process: megatron-core trained with ``overrides``, then the native engine with the same overrides from the
    megatron-core model's initial weights (mapped by :mod:`megatron_bridge.engines.megatron_core.weights`); both
    runs' per-step losses (``losses``, ``native_losses``). ``save_initial``: also write the megatron-core initial
    weights there."""
    from megatron_bridge.engines.megatron_core.weights import megatron_core_to_native
    from megatron_bridge.training.pretrain import pretrain

    initial, step_ends = InitialWeights(), StepEnds()
    result = pretrain(mcore_config(**overrides), callbacks=[initial, step_ends])
    assert result.backend == "mcore_ddp" and result.final_step == 8
    assert step_ends.losses == pytest.approx(result.losses, rel=1e-6)  # the callbacks fire here too, once per step
    if save_initial is not None:
        torch.save(initial.weights, save_initial)
    native = mcore_config(**overrides)
    native.model.engine = "native"
    mapped = megatron_core_to_native(initial.weights, native.model)
    native_result = pretrain(native, callbacks=[InitialWeights(load=mapped)])
    assert native_result.backend == "ddp"
    return {"losses": result.losses, "native_losses": native_result.losses}


def train_and_record(overrides: dict[str, Any], out: str) -> None:
    """Worker: install the harness, train, write rank 0's losses to ``out``. The one-process ``reference``
    (no overrides) also trains the native engine from the megatron-core model's initial weights and records its
    losses as ``native_losses``, and both engines with each sliding window of :data:`WINDOWS` (``windows``). In the
    shared 2-rank launch pretrain() reuses the launch's process group; megatron-core's groups are destroyed after the
    run (the next layout may differ)."""
    from megatron_bridge.engines.megatron_core import parallel_state
    from megatron_bridge.training.pretrain import pretrain
    from tests.functional_tests.mcore_cpu_harness import install

    install()
    record: dict[str, Any]
    if not overrides:  # the one-process reference: both engines from the same weights, without and with a window
        record = megatron_core_and_native({})
        record["windows"] = {name: megatron_core_and_native(window) for name, window in WINDOWS.items()}
        record["moe"] = megatron_core_and_native(MOE, save_initial=str(Path(out).parent / "moe_initial.pt"))
    else:
        if not dist.is_initialized():
            dist.init_process_group("gloo")  # kept for the launch's next test
        moe = os.environ.get("MB_MCORE_MOE_INITIAL")
        callbacks = [ReferenceWeights(moe)] if moe and overrides.get("model.num_moe_experts") else []
        try:
            result = pretrain(mcore_config(**overrides), callbacks=callbacks)
        finally:
            parallel_state.destroy()
        assert result.backend == "mcore_ddp" and result.final_step == 8
        record = {"losses": result.losses}
    if int(os.environ.get("RANK", "0")) == 0:
        Path(out).write_text(json.dumps(record))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """Losses of the one-process megatron-core run (launching process only: a 1-rank torchrun job)."""
    if is_worker():
        return None
    path = tmp_path_factory.mktemp("mcore_reference") / "reference.json"
    launch(f"{__file__}::test_two_ranks_match_one_process[tp2]", nproc=1,
           env={"MB_MCORE_OUT": str(path), "MB_MCORE_LAYOUT": "reference"})
    return path


@pytest.fixture(scope="module")
def launches(reference: Path | None, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The 2-rank launch (launching process only), running the layouts this session selected; each writes rank 0's
    losses to ``$MB_MCORE_DIR/<layout>.json``."""
    if is_worker():
        return None
    work = tmp_path_factory.mktemp("mcore_layouts")
    return LaunchGroups(__file__, selected_groups(request, GROUPS), {2: 600},
                        env={"MB_MCORE_DIR": str(work),
                             "MB_MCORE_MOE_INITIAL": str(reference.parent / "moe_initial.pt")})  # type: ignore[union-attr]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_two_ranks_match_one_process(layout: str, reference: Path | None, launches: LaunchGroups | None) -> None:
    """TP=2 and DP=2 (distributed optimizer, overlapped reduction) train like one process."""
    if not is_worker():
        launches.check(f"test_two_ranks_match_one_process[{layout}]")  # type: ignore[union-attr]
        out = Path(launches.env["MB_MCORE_DIR"]) / f"{layout}.json"  # type: ignore[union-attr]
        got, want = json.loads(out.read_text()), json.loads(reference.read_text())  # type: ignore[union-attr]
        want = want["moe"] if layout in MOE_LAYOUTS else want
        assert_finite_decreasing(want["losses"])
        for a, b in zip(got["losses"], want["losses"], strict=True):
            assert abs(a - b) <= LOSS_RTOL * abs(b), (layout, got["losses"], want["losses"])
        if layout == "tp2":  # the same initial weights as TP=1, so the native engine's losses apply too
            for a, b in zip(got["losses"], want["native_losses"], strict=True):
                assert abs(a - b) <= CROSS_ENGINE_ATOL, (got["losses"], want["native_losses"])
        print(f"[parity] megatron-core {layout}: losses {got['losses']} reference {want['losses']}")
        return
    if os.environ.get("MB_MCORE_LAYOUT") == "reference":  # the reference fixture's 1-rank job
        train_and_record({}, os.environ["MB_MCORE_OUT"])
    else:
        train_and_record(LAYOUTS[layout], str(Path(os.environ["MB_MCORE_DIR"]) / f"{layout}.json"))


@pytest.mark.support_cells("llama:megatron_core")
def test_native_engine_matches_megatron_core_from_the_same_weights(reference: Path | None) -> None:
    """Cross-engine parity (TP=1, fp32): the native engine started from the megatron-core model's initial weights
    (mapped names and fused layouts) gives the same per-step losses on the same data."""
    if is_worker():
        pytest.skip("compares the files of the reference job")
    ref = json.loads(reference.read_text())  # type: ignore[union-attr]
    for a, b in zip(ref["native_losses"], ref["losses"], strict=True):
        assert abs(a - b) <= CROSS_ENGINE_ATOL, (ref["native_losses"], ref["losses"])
    print(f"[parity] native vs megatron-core TP=1: {ref['native_losses']} vs {ref['losses']}")


@pytest.mark.support_cells("qwen3_moe:megatron_core")
def test_native_engine_matches_megatron_core_moe_from_the_same_weights(reference: Path | None) -> None:
    """Cross-engine parity of an MoE model (TP=1, fp32, :data:`MOE`): megatron-core's ``MoELayer`` (router in fp32,
    sequential experts, shared expert, aux and z losses through its ``MoEAuxLossAutoScaler``, scaled per step by
    :class:`megatron_bridge.engines.megatron_core.moe.MegatronCoreMoETracker`) and the native MoE layer started from
    the same weights (experts mapped by :mod:`megatron_bridge.engines.megatron_core.weights`) give the same per-step
    losses."""
    if is_worker():
        pytest.skip("compares the files of the reference job")
    got = json.loads(reference.read_text())["moe"]  # type: ignore[union-attr]
    assert_finite_decreasing(got["losses"])
    for a, b in zip(got["native_losses"], got["losses"], strict=True):
        assert abs(a - b) <= CROSS_ENGINE_ATOL, (got["native_losses"], got["losses"])
    print(f"[parity] native vs megatron-core MoE: {got['native_losses']} vs {got['losses']}")


@pytest.mark.support_cells("mistral:megatron_core")
@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_native_engine_matches_megatron_core_with_a_sliding_window(window: str, reference: Path | None) -> None:
    """Cross-engine parity with a 32-token sliding window on 64-token sequences (TP=1, fp32; tiny_mistral's window,
    in every layer or with every 2nd layer full): megatron-core's local attention (its window mask built on the CPU
    through the harness, masked scores filled with -10000) and the native engine's SDPA band mask give the same
    per-step losses from the same initial weights, and those differ from the full-attention run's."""
    if is_worker():
        pytest.skip("compares the files of the reference job")
    ref = json.loads(reference.read_text())  # type: ignore[union-attr]
    got = ref["windows"][window]
    assert_finite_decreasing(got["losses"])
    for a, b in zip(got["native_losses"], got["losses"], strict=True):
        assert abs(a - b) <= CROSS_ENGINE_ATOL, (window, got["native_losses"], got["losses"])
    effect = max(abs(a - b) for a, b in zip(got["losses"], ref["losses"], strict=True))
    assert effect >= WINDOW_EFFECT, (window, got["losses"], ref["losses"])
    print(f"[parity] native vs megatron-core, window {window}: {got['native_losses']} vs {got['losses']} "
          f"(full attention differs by up to {effect:.2e})")


RUN_RECIPE_CASES: dict[str, tuple[list[str], str, str, str]] = {
    "ddp_tp2": (["model.tensor_model_parallel_size=2"], "mcore_ddp", "TP 2, PP 1, CP 1, DP 1", "1"),
    "megatron_fsdp_dp2": (["dist.use_megatron_fsdp=true", "ddp.data_parallel_sharding_strategy=optim_grads_params",
                           "checkpoint.ckpt_format=fsdp_dtensor"],
                          "mcore_megatron_fsdp", "TP 1, PP 1, CP 1, DP 2", "fsdp"),
}
"""run_recipe.py case → (overrides, backend, megatron-core layout, harness mode of the workers
(mcore_cpu_harness.py's ``workers_env``): ``fsdp`` adds megatron-core's FSDP wrappers' redirections)."""


def _processes_with(marker: str) -> list[int]:
    """PIDs of live processes whose environment holds ``marker`` (``NAME=value``), from /proc."""
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes().split(b"\0"):
                pids.append(int(environ.parent.name))
        except OSError:
            continue  # ended meanwhile, or not ours
    return pids


@pytest.mark.parametrize("case", sorted(RUN_RECIPE_CASES))
def test_run_recipe_tiny_llama_trains_on_megatron_core(case: str, tmp_path: Path) -> None:
    """``run_recipe.py --recipe tiny_llama --nproc 2 model.engine=megatron_core`` at TP=2 (megatron-core DDP) and at
    DP=2 under Megatron FSDP trains, evaluates and saves a checkpoint (the harness enters the workers through
    sitecustomize); no process of the run outlives it (megatron-core's torch_dist writer starts a multiprocessing
    manager that ``os._exit``-ended workers would orphan). The manager starts with ``spawn``, so its environment holds
    the marker also when the workers fork warm (a forked process's /proc environ is the fork server's)."""
    overrides, backend, layout, harness_mode = RUN_RECIPE_CASES[case]
    marker = f"MB_RUN_RECIPE_TEST={os.getpid()}-{case}"
    env = {**os.environ, **workers_env(harness_mode), marker.split("=")[0]: marker.split("=")[1]}
    cmd = [sys.executable, "scripts/training/run_recipe.py", "--recipe", "tiny_llama", "--nproc", "2",
           "model.engine=megatron_core", *overrides, "train.train_iters=6",
           "train.global_batch_size=8", "train.micro_batch_size=2", "validation.eval_iters=1",
           "scheduler.lr_warmup_iters=1", "scheduler.lr_warmup_fraction=null", f"checkpoint.save={tmp_path / 'ckpt'}",
           "checkpoint.save_interval=6"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=420)
    output = proc.stdout + proc.stderr
    deadline = time.monotonic() + 10
    while (left := _processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"processes of the run outlived it: {left}\n{output[-3000:]}"
    assert proc.returncode == 0, output[-6000:]
    assert f"with {backend}" in output, output[-4000:]
    assert f"megatron-core parallel state: {layout}" in output, output[-4000:]
    done = [line for line in output.splitlines() if line.startswith("done: at step 6 (train_iters)")]
    assert done, output[-4000:]
    first, last = (float(x) for x in done[0].split("loss ")[1].split(";")[0].split(" -> "))
    assert last < first, done[0]
    assert "validation loss at iteration 6" in output, output[-4000:]
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "6", output[-4000:]
