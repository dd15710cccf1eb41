"""pretrain() of the tiny MoE model on Megatron FSDP (the CPU harness on gloo ranks) against one process at EP=1.

The model and steps are ``test_expert_parallel.moe_config``'s (8 AdamW steps of 8 samples, 2 micro-batches per rank
at 2 ranks, top-2 of 8 experts, aux loss, z-loss, expert bias, a shared expert, a dense first layer). Megatron FSDP
shards the routed experts over the expert-data-parallel group (megatron-fsdp's ``expt_device_mesh``) and everything
else over the data-parallel ranks. Tolerances: per-step losses rtol 1e-5, final weights atol 1e-5 (observed
differences come from float summation order only).

* ``test_ep2_every_strategy``: 2 ranks, EP=2 (expert-data-parallel size 1), each sharding strategy (``no_shard``,
  ``optim``, ``optim_grads``, ``optim_grads_params``); then EP=1 (the experts sharded over both ranks, edp 2) with
  ``optim_grads_params``; then an fsdp_dtensor checkpoint of the EP=2 run at step 4 resumes bit for bit (losses and
  weights equal the uninterrupted run), resumes at EP=1 (edp 2; optimizer state included) matching the reference, and
  its model weights load under DDP at EP=2 (``checkpoint.load_optim=False``: Megatron FSDP keys the optimizer state
  differently, checkpoint/saved_run.py ``optimizer_layout_fix``), matching the reference.
* ``test_four_ranks_edp2``: 4 ranks, DP=4 × EP=2 (edp 2) with ``no_shard`` (the experts replicated over their edp
  group: the gradient norm counts them once) and ``optim_grads_params``; DP=2 × CP=2 with EP=2 over the dp × cp ranks
  (all-gather attention): the experts' parameters, gradients and AdamW moments are DTensors on the 2-rank
  expert-data-parallel mesh.
* ``test_tp2_ep2``: 2 ranks, TP=2 × EP=2 (ETP 1: EP folded over the TP ranks; edp 1) without sequence parallelism
  (``no_shard``) and with it (``optim_grads_params``); an fsdp_dtensor checkpoint of the latter at step 4 resumes bit
  for bit at TP=2 and resumes at TP=1 × EP=2 matching the reference. The TP-split parameters are megatron-fsdp
  DTensors on its ``("dp_cp", "tp")`` mesh.
* ``test_four_ranks_tp2_ep4``: 4 ranks, TP=2 × EP=4 × DP=2 with sequence parallelism (EP over the tp × dp ranks).

The 2-rank checks share one torchrun launch, the 4-rank ones another (``GROUPS``).
"""

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from megatron_bridge.config import decoder_names as names
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.training.callbacks import Callback
from megatron_bridge.training.pretrain import pretrain
from tests.functional_tests.launcher import LaunchGroups, is_worker, selected_groups
from tests.functional_tests.moe.test_expert_parallel import GlobalWeights, moe_config
from tests.functional_tests.training._common import assert_finite_decreasing, cached_reference, max_weight_diff


pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

LOSS_RTOL, WEIGHT_ATOL = 1e-5, 1e-5
STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
GROUPS: dict[int, list[str]] = {2: ["test_ep2_every_strategy", "test_tp2_ep2"],
                                 4: ["test_four_ranks_edp2", "test_four_ranks_tp2_ep4"]}


def mfsdp_moe_config(ep: int, strategy: str = "optim_grads_params", tp: int = 1, **overrides: Any) -> ConfigContainer:
    """The tiny MoE config on Megatron FSDP (fsdp_dtensor checkpoints) with ``strategy``; ``tp`` > 1: ETP 1 (EP
    folded over the TP ranks), sequence parallelism unless overridden."""
    cfg = moe_config(ep=ep, tp=tp, use_megatron_fsdp=True, **overrides)
    cfg.ddp.data_parallel_sharding_strategy = strategy
    if strategy == "no_shard":  # megatron-fsdp materializes meta models only when it shards parameters
        cfg.model.init_model_with_meta_device = False
    return cfg


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The module's launches (launching process only) with the one-process EP=1 reference."""
    if is_worker():
        return None
    env = {"MB_REFERENCE": str(cached_reference(moe_config(), tmp_path_factory)),
           "MB_CKPT_DIR": str(tmp_path_factory.mktemp("mfsdp_moe_ckpt"))}
    return LaunchGroups(__file__, selected_groups(request, GROUPS), {2: 870, 4: 870}, env=env)


def _join_harness() -> None:
    """The CPU harness (synchronous collectives, CUDA calls as no-ops) and one process group for the launch."""
    from tests.functional_tests.megatron_fsdp_cpu_harness import install

    assert not torch.cuda.is_available()
    install()
    if not dist.is_initialized():
        dist.init_process_group("gloo")


def _compare(losses: list[float], weights: dict[str, torch.Tensor], label: str, first_step: int = 0) -> None:
    ref = torch.load(os.environ["MB_REFERENCE"], weights_only=True)
    want = ref["losses"].tolist()[first_step:]
    assert len(losses) == len(want), (losses, want)
    for got, exp in zip(losses, want, strict=True):
        assert abs(got - exp) <= LOSS_RTOL * abs(exp), (label, losses, want)
    diff = max_weight_diff(weights, ref["weights"])
    assert diff <= WEIGHT_ATOL, f"{label}: max weight difference {diff} > {WEIGHT_ATOL}"
    if dist.get_rank() == 0:
        loss_rel = max(abs(g - w) / abs(w) for g, w in zip(losses, want, strict=True))
        line = f"[mfsdp moe parity] {label}: max weight diff {diff:.3e}, max loss rel diff {loss_rel:.3e}"
        print(line)
        if os.environ.get("MB_MOE_PARITY_LOG"):  # the launcher keeps a passing launch's output to itself
            with open(os.environ["MB_MOE_PARITY_LOG"], "a") as log:
                log.write(line + "\n")


class FullWeights(Callback):
    """Full weights at the end of training (the harness's gather of megatron-fsdp's uneven shards; the experts come
    out of the backend's state dict in their global ``[E, ...]`` shape)."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    def on_train_end(self, ctx: Any) -> None:
        from tests.functional_tests.megatron_fsdp_cpu_harness import full_weights

        assert ctx.backend.name == "megatron_fsdp"
        self.weights = full_weights(ctx.backend.model_state_dict()["model"])


class ExpertsOnEdp(Callback):
    """Each expert parameter, its gradient and its AdamW moments are DTensors on megatron-fsdp's expert mesh, whose
    ``"dp_cp"`` group is the ``edp``-rank expert-data-parallel group, not the data-parallel one."""

    def __init__(self, edp: int) -> None:
        self.edp = edp

    def on_train_end(self, ctx: Any) -> None:
        backend = ctx.backend
        backend.parameters()  # megatron-fsdp's distributed parameters in the module
        experts = {n: p for n, p in backend.chunks[0].module.named_parameters() if ".experts." in n}
        assert experts
        for name, param in experts.items():
            for t in (param, param.grad, *ctx.optimizer.state.get(param, {}).values()):
                if t is None or t.ndim == 0:  # no state on a rank whose shard is empty; AdamW's step
                    continue
                assert isinstance(t, DTensor) and t.device_mesh["dp_cp"].size() == self.edp, (name, t.device_mesh)
                assert t.shape[0] == 8 // backend.cfg.model.expert_model_parallel_size, (name, t.shape)


class TensorParallelParams(Callback):
    """megatron-fsdp's distributed parameters keep the TP split: every attention projection is a DTensor on its
    ``("dp_cp", "tp")`` mesh sharded over ``"tp"`` (as are the embedding and output layer); the attention norms,
    replicated over TP, are sharded over ``"dp_cp"`` only."""

    def on_train_end(self, ctx: Any) -> None:
        backend = ctx.backend
        tp = backend.cfg.model.tensor_model_parallel_size
        backend.parameters()  # megatron-fsdp's distributed parameters in the module
        params = dict(backend.chunks[0].module.named_parameters())
        split = [n for n in params if n.endswith(tuple(f".{p}.weight" for p in names.PROJECTIONS))
                 or n in names.VOCAB_PARAMETERS]
        assert len(split) == 3 * len(names.PROJECTIONS) + 2, sorted(params)
        for name in split:
            p = params[name]
            assert isinstance(p, DTensor) and p.device_mesh.mesh_dim_names == ("dp_cp", "tp"), (name, p)
            assert p.device_mesh["tp"].size() == tp and p.placements[1].is_shard(), (name, p.placements)
        norms = [p for n, p in params.items() if n.endswith(f"{names.ATTENTION_NORM}.weight")]
        assert len(norms) == 3 and all(p.device_mesh.mesh_dim_names == ("dp_cp",) for p in norms), norms


def _run(cfg: ConfigContainer, label: str, *extra: Callback) -> tuple[list[float], dict[str, torch.Tensor]]:
    weights = FullWeights()
    result = pretrain(cfg, callbacks=[weights, *extra])
    assert result.backend == "megatron_fsdp" and result.final_step == 8
    assert_finite_decreasing(result.losses)
    _compare(result.losses, weights.weights, label)
    return result.losses, weights.weights


def test_ep2_every_strategy(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_ep2_every_strategy")  # type: ignore[union-attr]
        return
    _join_harness()
    folder = Path(os.environ["MB_CKPT_DIR"]) / "ep2"
    for strategy in STRATEGIES:
        cfg = mfsdp_moe_config(2, strategy)
        if strategy == "optim_grads_params":  # the uninterrupted run of the resume check
            cfg.checkpoint.save, cfg.checkpoint.save_interval = str(folder), 4
        full = _run(cfg, f"EP=2 (edp 1), {strategy}", ExpertsOnEdp(1))
    _run(mfsdp_moe_config(1), "EP=1 (experts sharded over edp 2), optim_grads_params", ExpertsOnEdp(2))
    resumed_cfg = mfsdp_moe_config(2)
    resumed_cfg.checkpoint.load, resumed_cfg.checkpoint.ckpt_step = str(folder), 4
    weights = FullWeights()
    resumed = pretrain(resumed_cfg, callbacks=[weights])
    assert resumed.steps == [5, 6, 7, 8] and resumed.losses == full[0][4:], (resumed.losses, full[0])
    assert max_weight_diff(weights.weights, full[1]) == 0.0
    ep1 = mfsdp_moe_config(1)  # global expert tensors: the EP=2 checkpoint (optimizer state too) resumes at EP=1
    ep1.checkpoint.load, ep1.checkpoint.ckpt_step = str(folder), 4
    weights = FullWeights()
    moved = pretrain(ep1, callbacks=[weights])
    assert moved.steps == [5, 6, 7, 8]
    _compare(moved.losses, weights.weights, "EP=2 -> fsdp_dtensor checkpoint -> EP=1 (edp 2)", first_step=4)
    ddp = moe_config(ep=2)  # the same global expert tensors as a DDP checkpoint's (the optimizer state is nested)
    ddp.checkpoint.load, ddp.checkpoint.ckpt_step, ddp.checkpoint.load_optim = str(folder), 4, False
    global_weights = GlobalWeights()
    moved = pretrain(ddp, callbacks=[global_weights])
    assert moved.steps == [5, 6, 7, 8]
    ref = torch.load(os.environ["MB_REFERENCE"], weights_only=True)
    assert abs(moved.losses[0] - ref["losses"][4].item()) <= LOSS_RTOL * ref["losses"][4].item()


def test_four_ranks_edp2(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_four_ranks_edp2")  # type: ignore[union-attr]
        return
    _join_harness()
    for strategy in ("no_shard", "optim_grads_params"):
        _run(mfsdp_moe_config(2, strategy), f"DP=4 x EP=2 (experts sharded over edp 2), {strategy}", ExpertsOnEdp(2))
    cp = mfsdp_moe_config(2, context_parallel_size=2)
    cp.model.cp_comm_type = "all_gather"
    _run(cp, "DP=2 x CP=2, EP=2 over the dp x cp ranks (edp 2), optim_grads_params", ExpertsOnEdp(2))


def test_tp2_ep2(launches: LaunchGroups | None) -> None:
    """TP=2 × EP=2 on 2 ranks (ETP 1: EP folded over the TP ranks, each routing its part of the tokens; edp 1), without
    sequence parallelism (``no_shard``: megatron-fsdp's even ``[Replicate(), Shard(k)]`` DTensors) and with it
    (``optim_grads_params``); an fsdp_dtensor checkpoint of the TP=2 run at step 4 resumes bit for bit at
    TP=2, and resumes at TP=1 × EP=2 (optimizer state included) matching the reference."""
    if not is_worker():
        launches.check("test_tp2_ep2")  # type: ignore[union-attr]
        return
    _join_harness()
    folder = Path(os.environ["MB_CKPT_DIR"]) / "tp2"
    _run(mfsdp_moe_config(2, "no_shard", tp=2, sequence_parallel=False), "TP=2 x EP=2 (ETP 1), no SP, no_shard",
         TensorParallelParams())
    cfg = mfsdp_moe_config(2, tp=2)
    cfg.checkpoint.save, cfg.checkpoint.save_interval = str(folder), 4
    full = _run(cfg, "TP=2 x EP=2 (ETP 1), SP", TensorParallelParams(), ExpertsOnEdp(1))
    resumed_cfg = mfsdp_moe_config(2, tp=2)
    resumed_cfg.checkpoint.load, resumed_cfg.checkpoint.ckpt_step = str(folder), 4
    weights = FullWeights()
    resumed = pretrain(resumed_cfg, callbacks=[weights])
    assert resumed.steps == [5, 6, 7, 8] and resumed.losses == full[0][4:], (resumed.losses, full[0])
    assert max_weight_diff(weights.weights, full[1]) == 0.0
    tp1 = mfsdp_moe_config(2)  # TP-independent checkpoint: global tensors (optimizer state too)
    tp1.checkpoint.load, tp1.checkpoint.ckpt_step = str(folder), 4
    weights = FullWeights()
    moved = pretrain(tp1, callbacks=[weights])
    assert moved.steps == [5, 6, 7, 8]
    _compare(moved.losses, weights.weights, "TP=2 x EP=2 -> fsdp_dtensor checkpoint -> TP=1 x EP=2", first_step=4)


def test_four_ranks_tp2_ep4(launches: LaunchGroups | None) -> None:
    """TP=2 × EP=4 × DP=2 on 4 ranks: EP folded over the tp × dp ranks (ETP 1, edp 1), sequence parallelism."""
    if not is_worker():
        launches.check("test_four_ranks_tp2_ep4")  # type: ignore[union-attr]
        return
    _join_harness()
    _run(mfsdp_moe_config(4, tp=2), "TP=2 x EP=4 x DP=2 (ETP 1), SP", TensorParallelParams(), ExpertsOnEdp(1))
