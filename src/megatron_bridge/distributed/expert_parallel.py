"""Expert parallelism (EP): the routed experts of every MoE layer split over ``model.expert_model_parallel_size``
ranks, tokens sent to their experts and back with ``all_to_all_single`` (uneven splits, autograd).

Layout (megatron-core's MoE parallel folding). Within a pipeline stage the ``R = dp × cp × tp`` ranks, in the main
mesh's order (``("pp", "dp", "cp", "tp")``, TP innermost), are re-split as the expert mesh
``("pp", "edp", "ep"[, "etp"])`` with ETP innermost: a rank's position in its stage is
``edp index × EP × ETP + ep index × ETP + etp index``, so ``edp = R / (EP × ETP)`` (``"pp"`` and ``"etp"`` only
when > 1; ETP is 1 or TP, rule ``expert_tensor_parallel``). With ETP 1 an EP group takes the TP ranks first, then CP
ranks, then data-parallel ranks: at TP4 × EP4 (Qwen3-30B-A3B on 8 GPUs with PP2) the EP group is the TP group. Each
rank holds experts ``ep_rank * E/ep .. (ep_rank + 1) * E/ep - 1`` of every MoE layer, whole with ETP 1. With
ETP = TP the ETP groups are the TP groups and EP runs over ``dp × cp``: each rank keeps its part of every local
expert's ``F`` dimension (gate/up column-wise, down row-wise, :func:`etp_dim`), the TP group's tokens stay
replicated (gathered under sequence parallelism, as for EP = 1), and ``GroupedExperts`` sums its input gradient and
its partial outputs over the ETP group (``GroupedExperts.tp_group``). ETP > 1 builds this state even at EP = 1.
:func:`expert_rank_grid` gives the global ranks of the expert mesh. With TP = 1 this is EP carved out of
``dp × cp`` as before.

Tokens. With EP > 1 and TP > 1 the TP ranks of a group no longer route the same tokens: each routes its own part
(:mod:`.expert_tokens`: its sequence shard under sequence parallelism, else its ``1/TP`` slice of the sequence,
gathered again after the experts), so every token reaches its experts once. The router's weight, replicated over
TP, sees only the rank's tokens: its gradient is summed over the TP group (``TopKRouter.tp_group``), and the
load-balancing statistics are summed over CP and TP like over CP alone. The shared expert keeps its column/row
split over TP and sees the whole sequence. With EP = 1 the MoE layer sees the TP group's tokens replicated, as a
dense MLP.

Dispatch (:class:`AllToAllDispatcher`): each rank sorts its token copies by global expert, exchanges the per-expert
counts (one ``all_to_all_single`` of ``E`` integers), sends the rows with ``all_to_all_single_autograd`` (uneven and
zero splits are fine on gloo and NCCL), reorders what it received from source-major to expert-major, runs its local
experts (grouped matmul), undoes the reordering and sends the outputs back the same way. Routing, probabilities
and the weighted sum stay on the token's own rank, so outputs equal the EP=1 layer's up to float rounding.

Gradients. Under DDP the expert weights are plain tensors owned by this module, not by the data-parallel backend:
DDP ignores them (``_set_params_and_buffers_to_ignore_for_model``), and so does FSDP2 when the expert-data-parallel
size is 1 (``ignored_params``). After the last micro-batch :meth:`ExpertParallel.reduce_grads` sums their gradients
over the expert-data-parallel group (``"edp"``, the ranks of the stage holding the same experts, now spanning
data-parallel, CP and TP ranks) and divides by ``dp × cp``: the ranks of a stage together see every token of the
step once, each scaled by the ``dp × cp / tokens`` factor of the training loop, so this equals the data-parallel
mean the backends apply to every other weight (with ETP = TP the ``dp × cp`` ranks of one expert part see every
token once). Under FSDP2 with an expert-data-parallel size > 1 each MoE layer's experts module is an FSDP2 unit of
its own on the 1-D ``"edp"`` mesh (:func:`~.fsdp2_sharding.shard_experts`; ``ExpertParallel.edp_sharded``): the
parameters, gradients and optimizer state are DTensors sharded on the local-expert dimension over ``"edp"``, and the
reduce-scatter computes the same sum over ``"edp"`` divided by ``dp × cp`` (``set_gradient_divide_factor(dp × cp)``
with sum-only collectives), so :meth:`ExpertParallel.reduce_grads` skips them. Gradient clipping
(:meth:`ExpertParallel.clip_grad_norm`) adds the experts' squared norm summed over the EP (and ETP) group — and
first over ``"edp"`` when the experts are sharded there (each edp rank's local shard counted once) — to the other
parameters' squared norm and sums over the pipeline stages.

Pipeline stages hold different MoE layers: each rank keeps the experts of the layers its stages hold, the
dispatchers exchange tokens within the stage's EP group, and a stage without MoE layers has no expert parameters.

Checkpoints are independent of the EP and ETP sizes: :meth:`ExpertParallel.globalize` turns the expert weights (and
their optimizer state) into DTensors of the full ``[E, ...]`` shape, sharded over ``"ep"`` (and on ``F`` over
``"etp"``) and replicated over ``"edp"``, before DCP saves or loads them; :meth:`ExpertParallel.localize` turns them
back. The experts' biases (``model.add_bias_linear``, GPT-OSS) travel with their experts: sharded over ``"ep"`` like
the weights (rule ``moe_expert_bias`` keeps ETP 1 with them). Experts sharded over ``"edp"`` by FSDP2 are first
gathered over ``"edp"`` (``full_tensor``: the EP rank's experts, a transient copy while saving or loading), so the
checkpoint keys and shapes are the same as under DDP; on load :meth:`ExpertParallel.to_live` cuts each rank's
``"edp"`` shard out again (no communication). A checkpoint written under DDP loads under FSDP2 and the other way
round. A checkpoint written at EP=2 loads at EP=1 (and the other way round), one written at TP=2 × EP=2 loads at
TP=2 × ETP=2 × EP=1, and training continues identically.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor

from megatron_bridge.config.decoder_names import DOWN, EXPERT_BIASES, EXPERT_WEIGHTS
from megatron_bridge.config.rules_moe import expert_tensor_parallel_size, splits_tokens_over_tp
from megatron_bridge.distributed.common import has_meta_params
from megatron_bridge.distributed.expert_tokens import TensorParallelTokens
from megatron_bridge.models.moe import GroupedExperts, MoELayer
from megatron_bridge.models.provider import materialize_meta_model
from megatron_bridge.utils.logging import get_logger, log_rank_0


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.distributed.init import DistEnv

logger = get_logger(__name__)



def expert_rank_grid(world_size: int, pp: int, ep: int, etp: int = 1) -> torch.Tensor:
    """Global ranks of the expert mesh, shape ``(pp, edp, ep, etp)`` (module docstring): the main mesh's ranks in
    order, each stage's ``dp × cp × tp`` ranks re-split with ETP innermost."""
    stage = world_size // pp
    return torch.arange(world_size).reshape(pp, stage // (ep * etp), ep, etp)


def build_expert_mesh(cfg: "ConfigContainer", env: "DistEnv") -> DeviceMesh:
    """The ``(["pp",] "edp", "ep")`` expert mesh of the whole job over :func:`expert_rank_grid` (a collective: every
    rank calls it). Its ``"pp"`` groups are the pipeline groups of the main mesh.

    Raises:
        ConfigValidationError: EP does not divide data-parallel size × CP × TP, or ETP is not 1 (rules
            ``expert_parallel_layout``, ``expert_tensor_parallel``).
    """
    from megatron_bridge.config.rule_set import enforce

    enforce(cfg, "positive_sizes", "world_size_divisible", "expert_tensor_parallel", "expert_parallel_layout",
            world_size=env.world_size)
    m = cfg.model
    pp, ep = m.pipeline_model_parallel_size, m.expert_model_parallel_size
    grid = expert_rank_grid(env.world_size, pp, ep, expert_tensor_parallel_size(cfg))
    names = ("pp", "edp", "ep", "etp")
    keep = [i for i, name in enumerate(names) if name in ("edp", "ep") or grid.shape[i] > 1]
    grid = grid.reshape([grid.shape[i] for i in keep])
    return DeviceMesh(env.device.type, grid, mesh_dim_names=tuple(names[i] for i in keep))


class AllToAllDispatcher:
    """Sends token rows to the EP rank owning their expert and brings the outputs back (module docstring)."""

    def __init__(self, group: dist.ProcessGroup, ep_size: int, num_local_experts: int) -> None:
        self.group = group
        self.ep_size = ep_size
        self.num_local_experts = num_local_experts

    def __call__(self, experts: GroupedExperts, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """``x_sorted [N, h]`` sorted by global expert with ``counts [E]`` → expert outputs in the same order."""
        ep, n_local = self.ep_size, self.num_local_experts
        counts = counts.to(torch.int64)
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.group)
        recv_matrix = received.view(ep, n_local)  # [source rank, local expert]
        send_splits = counts.view(ep, n_local).sum(dim=1).tolist()
        recv_splits = recv_matrix.sum(dim=1).tolist()
        x_recv = _wait(all_to_all_single_autograd(x_sorted, recv_splits, send_splits, self.group))
        perm = expert_major_order(recv_matrix)
        y = experts(x_recv[perm], recv_matrix.sum(dim=0))
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(perm.numel(), device=perm.device)
        return _wait(all_to_all_single_autograd(y[inverse], send_splits, recv_splits, self.group))


def _wait(tensor: torch.Tensor) -> torch.Tensor:
    wait = getattr(tensor, "wait", None)
    return wait() if callable(wait) else tensor


def expert_major_order(counts: torch.Tensor) -> torch.Tensor:
    """Row order that turns blocks laid out source-major (``counts[src, e]`` rows for each ``(src, e)``, src outer)
    into expert-major order (e outer, src inner). Stable within each block."""
    n_src, n_exp = counts.shape
    block = torch.arange(n_src * n_exp, device=counts.device).repeat_interleave(counts.reshape(-1))
    key = (block % n_exp) * n_src + block // n_exp
    return torch.argsort(key, stable=True)


@dataclass
class ExpertParallel:
    """The expert-parallel state of the wrapped model chunks: mesh, groups and the expert parameters."""

    mesh: DeviceMesh
    dp_size: int
    """Data-parallel × context-parallel size (the backends' gradient-averaging group)."""
    pp_group: dist.ProcessGroup | None = None
    """The pipeline group (PP > 1): the gradient norm is summed over the stages."""
    params: list[dict[str, nn.Parameter]] = field(default_factory=list)
    """Per chunk: fully qualified name (as in the chunk's state dict) → local expert parameter."""
    global_experts: int = 0
    owners: list[dict[str, tuple[nn.Module, str]]] = field(default_factory=list)
    """Per chunk: the same names → (``GroupedExperts`` module, attribute), to find the parameters again after FSDP2
    replaced them (:meth:`refresh_params`)."""
    edp_sharded: bool = False
    """True when FSDP2 shards the expert parameters over ``"edp"`` (DTensors on the 1-D ``"edp"`` mesh, dimension 0):
    FSDP2 reduces their gradients, checkpoints gather the ``"edp"`` shards (module docstring)."""

    @property
    def ep_group(self) -> dist.ProcessGroup:
        """The ranks exchanging tokens (one EP group)."""
        return self.mesh.get_group("ep")

    @property
    def edp_group(self) -> dist.ProcessGroup:
        """The ranks holding the same experts (expert-data-parallel group)."""
        return self.mesh.get_group("edp")

    @property
    def etp_group(self) -> dist.ProcessGroup | None:
        """The ranks holding parts of the same experts (ETP > 1), else None."""
        return self.mesh.get_group("etp") if "etp" in (self.mesh.mesh_dim_names or ()) else None

    def placements(self, name: str) -> tuple[Placement, ...]:
        """Expert weight ``name``: replicated over ``edp``, sharded on the expert dimension over ``ep`` and on its
        ``F`` dimension over ``etp`` (gate/up column-wise, down row-wise)."""
        styles = {"ep": Shard(0), "etp": Shard(etp_dim(name))}
        return tuple(styles.get(dim, Replicate()) for dim in self.mesh.mesh_dim_names or ())

    def all_params(self) -> list[nn.Parameter]:
        """Every local expert parameter of every chunk."""
        return [p for chunk in self.params for p in chunk.values()]

    def refresh_params(self) -> None:
        """Read the expert parameters again from their modules (after ``fully_shard`` made them DTensors)."""
        self.params = [{name: getattr(module, attr) for name, (module, attr) in chunk.items()}
                       for chunk in self.owners]

    def _on_edp(self, value: Any) -> bool:
        """A DTensor on FSDP2's 1-D ``"edp"`` mesh (an edp-sharded expert weight or its optimizer state)."""
        return self.edp_sharded and isinstance(value, DTensor) and value.device_mesh.mesh_dim_names == ("edp",)

    # --------------------------------------------------------------------------------------------- gradients
    @torch.no_grad()
    def reduce_grads(self) -> None:
        """Sum expert gradients over ``edp`` and divide by the data-parallel size (module docstring); nothing for
        edp-sharded experts (FSDP2's reduce-scatter did it)."""
        grads = [p.grad for p in self.all_params() if p.grad is not None and not isinstance(p.grad, DTensor)]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        if self.mesh["edp"].size() > 1:
            dist.all_reduce(flat, group=self.edp_group)
        flat.div_(self.dp_size)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    @torch.no_grad()
    def clip_grad_norm(self, params: list[nn.Parameter], max_norm: float, device: torch.device,
                       counted: list[nn.Parameter] | None = None) -> torch.Tensor:
        """Global L2 gradient norm of ``params`` (the backend's, expert parameters included; of ``counted`` among
        them when given: a tied embedding's last-stage copy is clipped, not counted) and clipping by ``max_norm``
        (> 0) as ``torch.nn.utils.clip_grad_norm_`` does: ``grads *= min(1, max_norm / (norm + 1e-6))``."""
        expert_ids = {id(p) for p in self.all_params()}
        dense = [p.grad for p in params if p.grad is not None and id(p) not in expert_ids]
        counted_ids = {id(p) for p in (params if counted is None else counted)}
        dense_counted = [p.grad for p in params if p.grad is not None and id(p) not in expert_ids
                         and id(p) in counted_ids]
        experts = [p.grad for p in params if p.grad is not None and id(p) in expert_ids]
        total_sq = torch.zeros((), dtype=torch.float32, device=device)
        if dense_counted:
            norm = torch.nn.utils.get_total_norm(dense_counted, 2.0)
            norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
            total_sq = total_sq + norm.float().square()
        expert_sq = torch.zeros((), dtype=torch.float32, device=device)
        for g in experts:
            expert_sq += (g.to_local() if isinstance(g, DTensor) else g).float().square().sum()
        if self.edp_sharded:  # each edp rank holds a part of the EP rank's experts: add the parts
            dist.all_reduce(expert_sq, group=self.edp_group)
        dist.all_reduce(expert_sq, group=self.ep_group)
        if self.etp_group is not None:
            dist.all_reduce(expert_sq, group=self.etp_group)
        total_sq = total_sq + expert_sq
        if self.pp_group is not None:
            dist.all_reduce(total_sq, group=self.pp_group)
        total = total_sq.sqrt()
        if max_norm > 0:
            coef = float(torch.clamp(max_norm / (total + 1e-6), max=1.0))
            if coef < 1.0:
                for g in dense + experts:
                    g.mul_(coef)
        return total

    # ------------------------------------------------------------------------------------------- checkpoints
    def _global(self, local: torch.Tensor, name: str) -> DTensor:
        if isinstance(local, DTensor):  # edp-sharded (FSDP2): the EP rank's experts, gathered over "edp"
            local = local.full_tensor()
        shape = [self.global_experts, *local.shape[1:]]
        if self.etp_group is not None:
            shape[etp_dim(name)] *= self.mesh["etp"].size()
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(local, self.mesh, self.placements(name), run_check=False, shape=torch.Size(shape),
                                  stride=stride)

    def globalize(self, state: dict[str, Any], chunk: int = 0) -> dict[str, Any]:
        """A model state dict of chunk ``chunk`` with the expert weights as global-shape DTensors sharing the local
        storage (DCP fills them in place on load)."""
        names = self.params[chunk]
        return {k: self._global(v, k) if k in names and self._is_expert_value(v) else v for k, v in state.items()}

    def globalize_optimizer(self, state: dict[str, Any]) -> dict[str, Any]:
        """An optimizer state dict (``get_optimizer_state_dict``'s, keyed by parameter name, flat
        ``state.<name>.<key>`` or nested ``{"state": {name: {key: tensor}}}``) with the per-expert state tensors of
        expert parameters as global DTensors. New containers: the live optimizer state stays local."""
        names = {k for chunk in self.params for k in chunk}
        if "state" in state and isinstance(state["state"], dict):
            per_param = {
                key: {n: self._global(v, key) if self._is_expert_value(v) and key in names else v
                      for n, v in entry.items()}
                if isinstance(entry, dict) else entry
                for key, entry in state["state"].items()
            }
            return {**state, "state": per_param}
        prefixes = tuple(f"state.{n}." for n in names)
        return {k: self._global(v, k.rsplit(".", 1)[0]) if k.startswith(prefixes) and self._is_expert_value(v)
                else v for k, v in state.items()}

    def _is_expert_value(self, value: Any) -> bool:
        return _is_local_tensor(value) or (self._on_edp(value) and value.ndim >= 1)

    def to_live(self, state: Any) -> Any:
        """:meth:`localize`, then, when FSDP2 shards the experts over ``"edp"``, each expert tensor (model weight,
        or flat ``state.<name>.<key>`` optimizer state) cut again into this rank's ``"edp"`` shard (a DTensor like
        the live one; every edp rank holds the same EP-rank tensor, so no communication)."""
        state = ExpertParallel.localize(state)
        if not self.edp_sharded:
            return state
        names = {k for chunk in self.params for k in chunk}
        return self._shard_edp(state, names)

    def _shard_edp(self, state: Any, names: set[str]) -> Any:
        if not isinstance(state, dict):
            return state
        mesh = self.mesh["edp"]
        out = {}
        for k, v in state.items():
            name = k[len("state."):].rsplit(".", 1)[0] if k.startswith("state.") else k
            if name in names and _is_local_tensor(v):
                out[k] = distribute_tensor(v, mesh, [Shard(0)], src_data_rank=None)
            else:
                out[k] = self._shard_edp(v, names)
        return out

    @staticmethod
    def localize(state: Any) -> Any:
        """The same (nested) state with every DTensor on an expert mesh replaced by its local tensor."""
        if isinstance(state, dict):
            return {k: ExpertParallel.localize(v) for k, v in state.items()}
        if isinstance(state, DTensor) and "ep" in (state.device_mesh.mesh_dim_names or ()):
            return state.to_local()
        return state


def etp_dim(name: str) -> int:
    """The dimension of expert weight ``name`` (a fully qualified name or state key ending in it) split over the
    expert-tensor-parallel ranks: ``F``, the last of gate/up ``[E, hidden, F]`` and the middle of down
    ``[E, F, hidden]``."""
    return 1 if name.rsplit(".", 1)[-1] == DOWN else 2


def _is_local_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not isinstance(value, DTensor) and value.ndim >= 1


def apply_expert_parallel(chunks: list[nn.Module], cfg: "ConfigContainer", env: "DistEnv", device: torch.device,
                          tp_mesh: DeviceMesh | None = None) -> ExpertParallel | None:
    """Keep this rank's experts in every MoE layer of ``chunks`` and install the all-to-all dispatcher; returns the
    :class:`ExpertParallel` the backend uses, or None when EP is 1 or the model has no MoE layer. With TP > 1
    (``tp_mesh``, the main mesh's TP dimension) each TP rank's MoE layers route only its part of the tokens (call
    before tensor parallelism: its plan reads ``MoELayer.tp_tokens``).

    Chunks built on the meta device are materialized whole first (expert weights are initialized as at EP=1, so the
    model equals the EP=1 model for a given seed), then sliced.
    """
    ep, etp = cfg.model.expert_model_parallel_size, expert_tensor_parallel_size(cfg)
    if (ep <= 1 and etp <= 1) or not any(isinstance(m, MoELayer) for chunk in chunks for m in chunk.modules()):
        return None
    mesh = build_expert_mesh(cfg, env)
    pp_group = None
    if "pp" in (mesh.mesh_dim_names or ()):  # the stage's (edp, ep[, tp]) sub-mesh; norms are summed over "pp"
        pp_group = mesh["pp"].get_group()
        mesh = mesh[tuple(name for name in mesh.mesh_dim_names or () if name != "pp")]
    m = cfg.model
    split = _token_split(cfg, tp_mesh, device.type)
    state = ExpertParallel(mesh=mesh, dp_size=env.world_size // (m.tensor_model_parallel_size
                                                                 * m.pipeline_model_parallel_size),
                           pp_group=pp_group, global_experts=m.num_moe_experts or 0)
    for chunk in chunks:
        if has_meta_params([chunk]):
            materialize_meta_model(chunk, device)
        else:
            chunk.to(device)
        owned = _shard_experts(chunk, mesh)
        state.params.append({name: getattr(module, attr) for name, (module, attr) in owned.items()})
        state.owners.append(owned)
        _install_token_split(chunk, split)
    log_rank_0(logger, "EP: %d experts over %d ranks (%d per rank), ETP %d, expert-data-parallel size %d, %d expert "
               "tensors%s", state.global_experts, ep, state.global_experts // ep, etp, mesh["edp"].size(),
               len(state.all_params()),
               f"; each of the {split.size} TP ranks routes its part of the tokens" if split is not None else "")
    return state


def _token_split(cfg: "ConfigContainer", tp_mesh: DeviceMesh | None,
                 device_type: str) -> TensorParallelTokens | None:
    if not splits_tokens_over_tp(cfg):
        return None
    if tp_mesh is None:  # the backends with TP pass theirs; else the main mesh's TP groups (TP innermost)
        tp = cfg.model.tensor_model_parallel_size
        world = dist.get_world_size()
        ranks = torch.arange(world).reshape(world // tp, tp)
        tp_mesh = DeviceMesh(device_type, ranks, mesh_dim_names=("rest", "tp"))["tp"]
    return TensorParallelTokens(tp_mesh.get_group(), tp_mesh.size(), tp_mesh.get_local_rank(),
                                cfg.model.sequence_parallel)


def _install_token_split(chunk: nn.Module, split: TensorParallelTokens | None) -> None:
    if split is None:
        return
    for module in chunk.modules():
        if isinstance(module, MoELayer):
            module.tp_tokens = split
            module.router.tp_group, module.router.tp_split = split.group, split.size


def _shard_experts(chunk: nn.Module, mesh: DeviceMesh) -> dict[str, tuple[nn.Module, str]]:
    ep, ep_rank = mesh["ep"].size(), mesh["ep"].get_local_rank()
    etp_group = mesh.get_group("etp") if "etp" in (mesh.mesh_dim_names or ()) else None
    etp, etp_rank = (mesh["etp"].size(), mesh["etp"].get_local_rank()) if etp_group is not None else (1, 0)
    owned: dict[str, tuple[nn.Module, str]] = {}
    for name, module in chunk.named_modules():
        if not isinstance(module, MoELayer):
            continue
        experts = module.experts
        per_rank = experts.num_experts // ep
        start = ep_rank * per_rank
        for weight in (*EXPERT_WEIGHTS, *EXPERT_BIASES):
            full = getattr(experts, weight)
            if full is None:  # no expert biases
                continue
            part = full.detach()[start : start + per_rank]
            if etp > 1:
                dim = etp_dim(weight)
                width = part.shape[dim] // etp
                part = part.narrow(dim, etp_rank * width, width)
            local = nn.Parameter(part.clone(), requires_grad=full.requires_grad)
            local._expert_parallel = True  # type: ignore[attr-defined]  # TP leaves it plain
            setattr(experts, weight, local)
            owned[f"{name}.experts.{weight}"] = (experts, weight)
        experts.num_local_experts, experts.expert_offset = per_rank, start
        experts.tp_group = etp_group
        module.dispatcher = AllToAllDispatcher(mesh.get_group("ep"), ep, per_rank)
    return owned


def ignore_in_ddp(module: nn.Module, expert_parallel: ExpertParallel | None) -> None:
    """Tell torch DDP not to reduce (or broadcast) the expert parameters of ``module`` (call after activation
    checkpointing wrapped its blocks, before wrapping it in DDP: DDP matches parameter names)."""
    if expert_parallel is None:
        return
    from torch.nn.parallel import DistributedDataParallel

    owned = {id(p) for p in expert_parallel.all_params()}
    names = [name for name, p in module.named_parameters() if id(p) in owned]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, names)
