"""pretrain() of the tiny MoE model with expert parallelism on gloo ranks against one process at EP=1.

Every case trains the same 8 AdamW steps (fp32, top-2 of 8 experts, aux loss, z-loss, aux-loss-free expert bias,
a shared expert, grouped matmuls) on the same global batches. The padded vocabulary is 512 in every case (so the TP
case has the same embedding shape). Tolerances: per-step losses rtol 1e-5, final weights (expert biases included)
atol 1e-5; observed differences come from float summation order only.

* ``test_two_ranks_match_ep1``: 2 ranks, DDP, one launch: EP=2 (4 experts per rank, expert-data-parallel size 1);
  PP=2 (1F1B) with MoE layers on one stage only; PP=2 × VP=2 under ZBVZeroBubble; CP=2 × EP=2 (EP over the CP
  ranks).
* ``test_four_ranks_match_ep1``: 4 ranks, one launch, eight layouts: FSDP2 with EP=2 × expert-data-parallel 2 (the
  experts' parameters, gradients and AdamW moments sharded over ``"edp"``: local shapes checked);
  FSDP2 with TP=2 (sequence parallel) × DP=2 and EP=4 folded over the TP and data-parallel ranks; FSDP2 with TP=2
  (SP) × DP=2 and EP=2 over the TP ranks, the experts sharded over the edp group of the DP ranks; FSDP2 with PP=2 ×
  TP=2 (SP) and EP=2 over the TP ranks of each stage; FSDP2 with TP=2 (SP) × DP=2, the experts split over TP
  (ETP=2) and EP=2 over DP; the Qwen3-235B layout in small, DDP with PP=2 (loss counted in the split) × CP=2 and EP=2
  over the CP ranks; DDP with TP=2 (SP) × DP=2 and EP=4 folded over TP × DP, and with PP=2 × TP=2 (SP), EP=2 over TP.
* ``test_checkpoint_ep2_to_ep1``: 2 ranks: steps 1-4 at EP=2 save a checkpoint; steps 5-8 load it at EP=1 (DDP over
  2 ranks) and continue: losses and weights equal the uninterrupted reference.
* ``test_checkpoint_edp_ddp_fsdp2``: 4 ranks, EP=2 × expert-data-parallel 2, one checkpoint format for both
  backends: steps 1-4 under DDP save; steps 5-6 under FSDP2 (experts sharded over ``"edp"``) load it and save; steps
  7-8 under DDP load that: losses and weights equal the reference.
* ``test_token_split_gather``: 2 ranks: the TP token split of MoE parallel folding (slice, gather) and its
  gradients (all-gather, split) against the formulas.
* ``test_folded_tp2_ep2_match_ep1``: 2 ranks, TP=2 × EP=2 with ETP 1 (EP over the TP ranks, each routing its own
  tokens): FSDP2 with sequence parallelism and without (the slice-and-gather path), DDP (torch's FSDP-based
  ``replicate`` over DTensor parameters) with it (the no-SP token path does not depend on the backend).
* ``test_checkpoint_folded_resume``: 2 ranks: steps 1-4 at TP=2 × EP=2 (FSDP2, SP) save a checkpoint; it resumes
  at the same layout bit-exact (losses and weights equal the uninterrupted TP=2 × EP=2 run; the same under DDP with its
  own checkpoint), at TP=1 × EP=2 over
  the data-parallel ranks (DDP) and at TP=2 × ETP=2 × EP=1 (each expert's ``F`` split over TP, tokens replicated),
  equal to the reference within the tolerances.

The 2-rank tests share one torchrun launch (``GROUPS``, launcher.py's ``LaunchGroups``; each stays a test of its own).
"""

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.distributed.expert_tokens import TensorParallelTokens
from megatron_bridge.recipes import tiny_moe_pretrain_config
from megatron_bridge.training.callbacks import Callback
from megatron_bridge.training.pretrain import pretrain
from tests.functional_tests.launcher import LaunchGroups, is_worker, selected_groups
from tests.functional_tests.training._common import assert_finite_decreasing, max_weight_diff


pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

LOSS_RTOL, WEIGHT_ATOL = 1e-5, 1e-5
STEPS = 8
GROUPS: dict[int, list[str]] = {2: ["test_two_ranks_match_ep1", "test_checkpoint_ep2_to_ep1", "test_token_split_gather",
                                    "test_folded_tp2_ep2_match_ep1", "test_checkpoint_folded_resume"],
                                4: ["test_four_ranks_match_ep1", "test_checkpoint_edp_ddp_fsdp2"]}
"""Tests launched together, by process count (one launch each)."""


def moe_config(ep: int = 1, tp: int = 1, etp: int = 1, **overrides: Any) -> ConfigContainer:
    """The tiny MoE recipe at seq 64, 8 steps of 8 samples, every MoE option on, no eval, no checkpoints."""
    base = {"train_iters": STEPS, "global_batch_size": 8, "micro_batch_size": 2, "seq_length": 64,
            "eval_interval": None, "lr_warmup_iters": 2, "log_interval": 4, "expert_model_parallel_size": ep,
            "tensor_model_parallel_size": tp, "sequence_parallel": tp > 1}
    cfg = tiny_moe_pretrain_config(**{**base, **overrides})
    m = cfg.model
    m.num_layers, m.moe_layer_freq = 3, [0, 1, 1]  # a dense first layer, then MoE
    m.moe_router_enable_expert_bias, m.moe_z_loss_coeff = True, 1e-3
    m.moe_shared_expert_intermediate_size = 64
    m.make_vocab_size_divisible_by = 256 // tp
    m.expert_tensor_parallel_size = etp
    cfg.checkpoint.save = cfg.checkpoint.load = None
    cfg.validation.eval_interval = None
    return cfg


class GlobalWeights(Callback):
    """Full weights at the end of training through the backend's (EP-independent) state dict, on every rank."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    def on_train_end(self, ctx: Any) -> None:
        state = ctx.backend.model_state_dict()["model"]
        self.weights = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
                        for k, v in state.items()}
        if ctx.cfg.model.pipeline_model_parallel_size > 1:  # each stage holds its layers: merge all ranks' keys
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, self.weights)
            self.weights = {k: v for part in gathered for k, v in part.items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """One process, EP=1: losses and weights (computed once, in the launching process only)."""
    if is_worker():
        return None
    weights = GlobalWeights()
    result = pretrain(moe_config(), callbacks=[weights])
    path = tmp_path_factory.mktemp("moe_reference") / "reference.pt"
    torch.save({"losses": torch.tensor(result.losses, dtype=torch.float64), "weights": weights.weights}, path)
    return path


@pytest.fixture(scope="module")
def launches(reference: Path | None, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The module's launches (launching process only), running the tests this session selected. The 4-rank launch
    allows 15 minutes (4 processes share 2 cores with other jobs; about 1.5 minutes on a busy 2-core machine)."""
    if is_worker():
        return None
    ckpt = tmp_path_factory.mktemp("moe_ckpt") / "ckpt"
    return LaunchGroups(__file__, selected_groups(request, GROUPS), {2: 600, 4: 900},
                        env={"MB_REFERENCE": str(reference), "MB_CKPT_DIR": str(ckpt)})


def _compare_losses(losses: list[float], label: str, first_step: int = 0) -> dict[str, Any]:
    ref = torch.load(os.environ["MB_REFERENCE"], weights_only=True)
    want = ref["losses"].tolist()[first_step : first_step + len(losses)]
    assert len(losses) == len(want), (losses, want)
    for got, exp in zip(losses, want, strict=True):
        assert abs(got - exp) <= LOSS_RTOL * abs(exp), (label, losses, want)
    return ref


def _compare(losses: list[float], weights: dict[str, torch.Tensor], label: str, first_step: int = 0) -> None:
    ref = _compare_losses(losses, label, first_step)
    assert first_step + len(losses) == STEPS
    diff = max_weight_diff(weights, ref["weights"])
    assert diff <= WEIGHT_ATOL, f"{label}: max weight difference {diff} > {WEIGHT_ATOL}"
    if int(os.environ["RANK"]) == 0:
        want = ref["losses"].tolist()[first_step : first_step + len(losses)]
        loss_rel = max(abs(g - w) / abs(w) for g, w in zip(losses, want, strict=True))
        line = f"[moe parity] {label}: max weight diff {diff:.3e}, max loss rel diff {loss_rel:.3e}, losses {losses}"
        print(line)
        if os.environ.get("MB_MOE_PARITY_LOG"):  # the launcher keeps a passing launch's output to itself
            with open(os.environ["MB_MOE_PARITY_LOG"], "a") as log:
                log.write(line + "\n")


def _join_job() -> None:
    """One process group for the whole test, created here (not by pretrain, which then reuses it and leaves it
    alone): a test that calls pretrain() twice must not destroy and re-create the group on the same torchrun store,
    which races (the second rendezvous can read the first one's keys)."""
    if not dist.is_initialized():
        dist.init_process_group("gloo")


class ExpertLoad(Callback):
    """Every rank, whatever stages it holds, ends with every MoE layer's global load of the last step: each token of
    the global batch counted k times (not once per TP/CP copy, stage or EP rank)."""

    def on_train_end(self, ctx: Any) -> None:
        m = ctx.cfg.model
        layers = [i for i, moe in enumerate(m.moe_layer_pattern()) if moe]
        load = ctx.moe.last.tokens_per_expert
        assert sorted(load) == layers, (sorted(load), layers)
        expected = ctx.cfg.train.global_batch_size * m.seq_length * m.moe_router_topk
        assert all(sum(counts) == expected for counts in load.values()), (load, expected)


class EdpSharded(Callback):
    """Under FSDP2 with EP=2 × edp 2 (8 experts): every expert weight, its gradient and its AdamW moments are DTensors
    on the 1-D ``"edp"`` mesh, sharded on the expert dimension: 2 of the EP rank's 4 experts on each rank."""

    def on_train_end(self, ctx: Any) -> None:
        experts = ctx.backend.expert_parallel
        assert experts.edp_sharded and experts.all_params()
        for p in experts.all_params():
            for t in (p, p.grad, *ctx.optimizer.state[p].values()):
                if t.ndim == 0:  # AdamW's step
                    continue
                assert isinstance(t, DTensor) and t.device_mesh.mesh_dim_names == ("edp",), type(t)
                assert t.shape[0] == 4 and t.to_local().shape[0] == 2, (t.shape, t.to_local().shape)
                assert t.placements[0].is_shard(0)


def _run(cfg: ConfigContainer, label: str, *extra: Callback) -> tuple[list[float], dict[str, torch.Tensor]]:
    weights = GlobalWeights()
    result = pretrain(cfg, callbacks=[weights, ExpertLoad(), *extra])
    assert result.final_step == STEPS
    assert_finite_decreasing(result.losses)
    _compare(result.losses, weights.weights, label)
    return result.losses, weights.weights


def test_two_ranks_match_ep1(launches: LaunchGroups | None) -> None:
    """One launch of 2 ranks, four layouts in turn: EP=2 with DDP; PP=2 with 1F1B (the embedding counts in the
    split, so stage 0 holds the dense layer 0 and no MoE layer, stage 1 the two MoE layers); PP=2 × VP=2 with
    ZBVZeroBubble (rank 0: the embedding stage and MoE layer 2, rank 1: layers 0 and 1); CP=2 with EP=2 carved over
    the CP ranks (the load-balancing loss over the whole sequence, token counts summed over CP)."""
    if not is_worker():
        launches.check("test_two_ranks_match_ep1")  # type: ignore[union-attr]
        return
    _join_job()
    _run(moe_config(ep=2), "EP=2, DDP")
    pipelined = moe_config(pipeline_model_parallel_size=2)
    pipelined.model.account_for_embedding_in_pipeline_split = True
    _run(pipelined, "PP=2 (stages with 0 and 2 MoE layers), DDP")
    zero_bubble = moe_config(pipeline_model_parallel_size=2)  # split backward (input, then weight gradients)
    zero_bubble.model.virtual_pipeline_model_parallel_size = 2
    zero_bubble.model.account_for_embedding_in_pipeline_split = True
    zero_bubble.model.pipeline_schedule = "ZBVZeroBubble"
    _run(zero_bubble, "PP=2 x VP=2 ZBVZeroBubble, DDP")
    _run(moe_config(ep=2, context_parallel_size=2), "CP=2 x EP=2, DDP")


@pytest.mark.timeout(1000)
def test_four_ranks_match_ep1(launches: LaunchGroups | None) -> None:
    """One launch of 4 ranks, the eight layouts of the module docstring in turn; the two FSDP2 layouts with an
    expert-data-parallel size of 2 check that the experts are sharded over it."""
    if not is_worker():
        launches.check("test_four_ranks_match_ep1")  # type: ignore[union-attr]
        return
    _join_job()
    _run(moe_config(ep=2, use_torch_fsdp2=True), "EP=2 x EDP=2 (experts sharded over edp), FSDP2", EdpSharded())
    _run(moe_config(ep=4, tp=2, use_torch_fsdp2=True), "TP=2 (SP) x DP=2, EP=4 folded over TP x DP, FSDP2")
    _run(moe_config(ep=2, tp=2, use_torch_fsdp2=True), "TP=2 (SP) x DP=2, EP=2 over TP, edp 2 (sharded), FSDP2",
         EdpSharded())
    folded_pp = moe_config(ep=2, tp=2, pipeline_model_parallel_size=2, use_torch_fsdp2=True)
    folded_pp.model.account_for_loss_in_pipeline_split = True  # stage 0: layers 0-1, stage 1: layer 2 + loss
    _run(folded_pp, "PP=2 x TP=2 (SP), EP=2 over TP, FSDP2")
    _run(moe_config(ep=2, tp=2, etp=2, use_torch_fsdp2=True), "TP=2 (SP) x DP=2, ETP=2 x EP=2 over DP, FSDP2")
    _run(moe_config(ep=4, tp=2), "TP=2 (SP) x DP=2, EP=4 folded over TP x DP, DDP (replicate)")
    folded_pp = moe_config(ep=2, tp=2, pipeline_model_parallel_size=2)
    folded_pp.model.account_for_loss_in_pipeline_split = True
    _run(folded_pp, "PP=2 x TP=2 (SP), EP=2 over TP, DDP (replicate)")
    shrunk_235b = moe_config(ep=2, pipeline_model_parallel_size=2, context_parallel_size=2)
    shrunk_235b.model.account_for_loss_in_pipeline_split = True  # stage 0: layers 0-1, stage 1: layer 2 + loss
    _run(shrunk_235b, "PP=2 x CP=2 x EP=2 (over CP), DDP")


def test_checkpoint_edp_ddp_fsdp2(launches: LaunchGroups | None) -> None:
    """DDP (experts whole, reduced over edp) and FSDP2 (experts sharded over edp) save and load the same global
    ``[E, ...]`` expert tensors: DDP steps 1-4, FSDP2 steps 5-6, DDP steps 7-8."""
    if not is_worker():
        launches.check("test_checkpoint_edp_ddp_fsdp2")  # type: ignore[union-attr]
        return
    _join_job()
    folder = os.environ["MB_CKPT_DIR"] + "_edp"
    first = moe_config(ep=2)
    first.checkpoint.save, first.checkpoint.save_interval, first.train.exit_interval = folder, 4, 4
    result = pretrain(first)
    assert result.steps == [1, 2, 3, 4]
    _compare_losses(result.losses, "EP=2 x EDP=2 DDP, steps 1-4")
    second = moe_config(ep=2, use_torch_fsdp2=True)
    second.checkpoint.load = second.checkpoint.save = folder
    second.checkpoint.save_interval, second.train.exit_interval = 2, 6
    result = pretrain(second, callbacks=[EdpSharded()])
    assert result.steps == [5, 6]
    _compare_losses(result.losses, "DDP -> checkpoint -> EP=2 x EDP=2 FSDP2, steps 5-6", first_step=4)
    third = moe_config(ep=2)
    third.checkpoint.load = folder
    weights = GlobalWeights()
    result = pretrain(third, callbacks=[weights])
    assert result.steps == [7, 8]
    _compare(result.losses, weights.weights, "DDP -> FSDP2 (edp-sharded) -> DDP, steps 7-8", first_step=6)


def test_checkpoint_ep2_to_ep1(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_checkpoint_ep2_to_ep1")  # type: ignore[union-attr]
        return
    _join_job()
    folder = os.environ["MB_CKPT_DIR"]
    first = moe_config(ep=2)
    first.checkpoint.save, first.checkpoint.save_interval, first.train.exit_interval = folder, 2, 4
    result = pretrain(first)  # saves at steps 2 (training goes on) and 4
    assert result.final_step == 4 and result.exit_reason == "exit_interval"
    _compare_losses(result.losses, "EP=2, steps 1-4")
    second = moe_config(ep=1)
    second.checkpoint.load = second.checkpoint.save = folder
    weights = GlobalWeights()
    resumed = pretrain(second, callbacks=[weights])
    assert resumed.steps == [5, 6, 7, 8]
    _compare(resumed.losses, weights.weights, "EP=2 -> checkpoint -> EP=1", first_step=4)


def test_token_split_gather(launches: LaunchGroups | None) -> None:
    """Without sequence parallelism a TP rank routes its slice of the sequence: the slice's gradient is all-gathered
    (every rank gets the whole input gradient) and the gathered output's gradient is split, not summed."""
    if not is_worker():
        launches.check("test_token_split_gather")  # type: ignore[union-attr]
        return
    _join_job()
    rank = dist.get_rank()
    split = TensorParallelTokens(dist.group.WORLD, 2, rank, sequence_parallel=False)
    x = torch.arange(2 * 4 * 3, dtype=torch.float64).reshape(2, 4, 3).requires_grad_()
    part = split.scatter(x)
    assert torch.equal(part, x.detach()[:, 2 * rank : 2 * rank + 2])
    y = split.gather(part * (rank + 1))  # ranks' parts differ: the gather must put each in its place
    assert torch.equal(y, torch.cat([x.detach()[:, :2], 2 * x.detach()[:, 2:]], dim=1))
    weight = torch.linspace(-1, 1, y.numel(), dtype=torch.float64).view_as(y)  # the same upstream gradient
    (y * weight).sum().backward()
    factor = torch.cat([torch.ones(2, 2, 3), 2 * torch.ones(2, 2, 3)], dim=1).double()
    assert torch.equal(x.grad, weight * factor)  # the whole input gradient on every rank
    sp = TensorParallelTokens(dist.group.WORLD, 2, rank, sequence_parallel=True)  # the shard arrives as it is
    assert sp.scatter(x) is x and sp.gather(y) is y


def test_folded_tp2_ep2_match_ep1(launches: LaunchGroups | None) -> None:
    """TP=2 × EP=2 on 2 ranks (ETP 1: the EP group is the TP group): FSDP2 with and without sequence parallelism,
    DDP with it."""
    if not is_worker():
        launches.check("test_folded_tp2_ep2_match_ep1")  # type: ignore[union-attr]
        return
    _join_job()
    _FOLDED_RUN["fsdp2"] = _run(moe_config(ep=2, tp=2, use_torch_fsdp2=True), "TP=2 (SP) x EP=2 over TP, FSDP2")
    no_sp = moe_config(ep=2, tp=2, use_torch_fsdp2=True, sequence_parallel=False)
    _run(no_sp, "TP=2 (no SP: slice and gather) x EP=2 over TP, FSDP2")
    _FOLDED_RUN["ddp"] = _run(moe_config(ep=2, tp=2), "TP=2 (SP) x EP=2 over TP, DDP (replicate)")


_FOLDED_RUN: dict[str, tuple[list[float], dict[str, torch.Tensor]]] = {}
"""The uninterrupted TP=2 × EP=2 (SP) runs of test_folded_tp2_ep2_match_ep1 (same launch) by backend ("fsdp2",
"ddp"): losses and final weights, for the bit-exact resumes."""


def _resumes_bit_exact(folder: str, backend: str) -> None:
    """Steps 1-4 at TP=2 × EP=2 (SP) on ``backend`` save a checkpoint into ``folder``; resumed at the same layout,
    steps 5-8 have exactly the uninterrupted run's losses and final weights."""
    fsdp2 = backend == "fsdp2"
    if backend not in _FOLDED_RUN:
        _FOLDED_RUN[backend] = _run(moe_config(ep=2, tp=2, use_torch_fsdp2=fsdp2), f"TP=2 x EP=2, {backend}")
    losses, final_weights = _FOLDED_RUN[backend]
    first = moe_config(ep=2, tp=2, use_torch_fsdp2=fsdp2)
    first.checkpoint.save, first.checkpoint.save_interval, first.train.exit_interval = folder, 4, 4
    assert pretrain(first).final_step == 4
    same = moe_config(ep=2, tp=2, use_torch_fsdp2=fsdp2)
    same.checkpoint.load = folder
    weights = GlobalWeights()
    resumed = pretrain(same, callbacks=[weights])
    assert resumed.steps == [5, 6, 7, 8]
    assert resumed.losses == losses[4:], (backend, resumed.losses, losses)
    assert max_weight_diff(weights.weights, final_weights) == 0.0


def test_checkpoint_folded_resume(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_checkpoint_folded_resume")  # type: ignore[union-attr]
        return
    _join_job()
    folder = os.environ["MB_CKPT_DIR"] + "_folded"
    _resumes_bit_exact(folder, "fsdp2")
    _resumes_bit_exact(folder + "_ddp", "ddp")
    other = moe_config(ep=2)  # TP=1, EP=2 over the data-parallel ranks, DDP
    other.checkpoint.load = folder
    weights = GlobalWeights()
    moved = pretrain(other, callbacks=[weights])
    assert moved.steps == [5, 6, 7, 8]
    _compare(moved.losses, weights.weights, "TP=2 x EP=2 (FSDP2) -> checkpoint -> TP=1 x EP=2 (DDP)", first_step=4)
    split = moe_config(tp=2, etp=2, use_torch_fsdp2=True)  # the experts split over TP instead of over EP
    split.checkpoint.load = folder
    weights = GlobalWeights()
    moved = pretrain(split, callbacks=[weights])
    _compare(moved.losses, weights.weights, "TP=2 x EP=2 -> checkpoint -> TP=2 x ETP=2 x EP=1", first_step=4)
