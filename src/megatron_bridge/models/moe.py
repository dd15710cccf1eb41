"""Mixture-of-experts feed-forward layer of the local engine: a top-k router, routed SwiGLU experts computed as
grouped matmuls (:mod:`megatron_bridge.models.experts`), an optional shared expert. Dropless: every token reaches
its k experts.

Module and parameter names (one MoE layer, ``layers.N.mlp``)::

    router.weight          [E, hidden]        router logits (computed in float32)
    router.bias            [E]                logit bias (add_bias_linear, GPT-OSS)
    router.expert_bias     [E] (buffer)       aux-loss-free balancing bias (moe_router_enable_expert_bias)
    experts.gate_proj      [E, hidden, F]     routed experts, F = moe_ffn_hidden_size
    experts.up_proj        [E, hidden, F]
    experts.down_proj      [E, F, hidden]
    experts.{gate,up}_bias [E, F]             expert biases (add_bias_linear, GPT-OSS)
    experts.down_bias      [E, hidden]
    shared_experts.{gate,up,down}_proj.weight  the shared expert (moe_shared_expert_intermediate_size), a plain MLP

The routed experts compute ``down(act(clamp(gate)) * (clamp(up) + glu_linear_offset)) (+ biases)`` with ``act`` SiLU
(``swiglu``) or quick GELU ``g * sigmoid(1.702 g)`` (``quick_geglu``), the clamp (``activation_func_clamp_value`` c)
taking the gate to at most c and the up half into ``[-c, c]``: megatron-core's experts and GPT-OSS's
(``(up + 1) * gate * sigmoid(1.702 gate)``, c = 7).

Routing (Megatron-core's rules, per token, on float32 logits ``z``, the router bias included):

* ``softmax`` with ``moe_router_pre_softmax=False``: top-k of ``z`` (plus the expert bias), probabilities =
  softmax over the k selected logits (they sum to 1; HF's ``norm_topk_prob=True``);
* ``softmax`` with ``moe_router_pre_softmax=True``: p = softmax(z) over all experts, top-k of p (+ bias), the k
  selected p as they are;
* ``sigmoid``: s = sigmoid(z), top-k of s (+ bias), the selected s divided by their sum when k > 1.

With ``moe_router_num_groups`` the top-k is taken only among the experts of each token's ``moe_router_group_topk``
best groups (:func:`limit_to_groups`; DeepSeek-V3's group-limited routing, and DeepSeek-V2's
``group_limited_greedy`` with softmax).

The expert bias shifts only the choice of experts, never the probabilities. ``moe_router_topk_scaling_factor``
multiplies the probabilities. The expert outputs are weighted by the probabilities and summed per token.

Load-balancing loss (``moe_aux_loss_coeff`` > 0), Switch Transformer's as Megatron-core computes it over ``T`` tokens
with routing counts ``c_e`` and full score distributions ``P`` (softmax of z, or sigmoid scores normalised to sum 1):
``coeff * E / (k * T**2) * sum_e c_e * sum_t P[t, e]``; ``seq_aux_loss`` applies it per sequence and averages.
Router z-loss: ``moe_z_loss_coeff * mean_t(logsumexp(z_t)**2)``. Both losses are not added to the model output:
:class:`AuxLossScaler` attaches them to the layer output so that backward adds their gradient times
:func:`set_aux_loss_scale`'s factor (the training loop sets ``1 / micro-batches``, so the gradient is the mean over
all micro-batches of the global batch, as Megatron's ``MoEAuxLossAutoScaler``). Under pipeline parallelism the
gradient enters on the stage that holds the layer, in that micro-batch's backward, whatever the schedule: no
communication between stages. Under context parallelism each rank's loss is its part of the whole sequence's
(:class:`TopKRouter`), and the factor is ``CP / micro-batches``.

MoE parallel folding (EP > 1 with TP > 1, ``expert_tensor_parallel_size=1``): the layer's ``tp_tokens`` hands each TP
rank its part of the tokens (:mod:`megatron_bridge.distributed.expert_tokens`); the router then treats the TP ranks
like CP ranks (statistics over the union of their tokens) and sums its weight's gradient over the TP group, since
each TP rank's copy of the weight saw only its own tokens.

Expert parallelism replaces the layer's ``dispatcher`` (see :mod:`megatron_bridge.distributed.expert_parallel`);
without it the tokens go to the local experts directly.
"""

from collections.abc import Callable
from typing import ClassVar, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.models.experts import (
    GroupedExperts,
    SumGradOver,
    grouped_mm,
    grouped_mm_supported,
    local_dispatch,
    local_tensor,
    num_experts_of,
    quick_gelu,
)


Dispatcher = Callable[["GroupedExperts", torch.Tensor, torch.Tensor], torch.Tensor]
"""``(experts, tokens sorted by expert [N, hidden], tokens per global expert [E]) -> expert outputs [N, hidden]``."""


class TokenSplit(Protocol):
    """A TP rank's part of the layer's tokens (``megatron_bridge.distributed.expert_tokens.TensorParallelTokens``)."""

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, s, hidden]`` input → the rank's tokens ``[b, s', hidden]``."""
        ...

    def gather(self, y: torch.Tensor) -> torch.Tensor:
        """The rank's routed output → the layer's output layout."""
        ...


class AuxLossScaler(torch.autograd.Function):
    """Identity on the layer output whose backward also sends ``scale`` as the gradient of an auxiliary loss."""

    scale: ClassVar[float] = 1.0

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, output: torch.Tensor, aux_loss: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(aux_loss)
        return output

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_output: torch.Tensor) -> tuple[torch.Tensor, ...]:
        (aux_loss,) = ctx.saved_tensors
        return grad_output, torch.full_like(aux_loss, AuxLossScaler.scale)


def set_aux_loss_scale(scale: float) -> None:
    """Factor applied to the gradients of the MoE auxiliary losses (1.0 unless the training loop sets it)."""
    AuxLossScaler.scale = float(scale)


def switch_aux_loss(scores: torch.Tensor, counts: torch.Tensor, topk: int, coeff: float,
                    num_tokens: int | None = None) -> torch.Tensor:
    """Switch load-balancing loss of ``scores [..., T, E]`` with routing counts ``counts [..., E]``, averaged over the
    leading dimensions: ``coeff * E / (k * T**2) * sum_e counts_e * sum_t scores[t, e]``.

    Under context parallelism ``scores`` are the rank's tokens, ``counts`` the counts of the whole sequence and
    ``num_tokens`` its length ``T``: the result is the rank's part of the loss, and the parts add up to the loss of
    the whole sequence."""
    t, e = num_tokens if num_tokens is not None else scores.shape[-2], scores.shape[-1]
    per_group = (scores.sum(dim=-2) * counts).sum(dim=-1) * (e * coeff / (topk * t * t))
    return per_group.mean()


def limit_to_groups(select: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """Group-limited routing (``moe_router_num_groups``/``moe_router_group_topk``): ``select [T, E]`` with the
    experts outside each token's ``moe_router_group_topk`` best groups set to ``-inf``. A group's score is, with
    sigmoid routing, the sum of its two highest ``select`` values (Hugging Face's ``DeepseekV3TopkRouter``;
    megatron-core sums the top ``topk // group_topk``, the same two for DeepSeek-V3's 8 of 4 groups) and, with softmax
    routing, its highest value (DeepSeek-V2's ``group_limited_greedy``, ``DeepseekV2TopkRouter``; the logits and the
    probabilities rank the groups alike). Unchanged without groups."""
    groups, keep = config.moe_router_num_groups, config.moe_router_group_topk
    if not groups or keep is None or keep >= groups:
        return select
    t, e = select.shape
    grouped = select.view(t, groups, e // groups)
    best = 2 if config.moe_router_score_function == "sigmoid" else 1
    group_scores = grouped.topk(min(best, e // groups), dim=-1).values.sum(dim=-1)
    chosen = torch.topk(group_scores, keep, dim=-1, sorted=False).indices
    mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, chosen, True)
    return grouped.masked_fill(~mask.unsqueeze(-1), float("-inf")).view(t, e)


def route(logits: torch.Tensor, config: ModelConfig,
          expert_bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k routing of float32 ``logits [T, E]`` (module docstring).

    Returns:
        probs ``[T, k]`` (float32), expert indices ``[T, k]`` and the full score distribution ``[T, E]`` used by the
        load-balancing loss.
    """
    k = config.moe_router_topk
    if config.moe_router_score_function == "sigmoid":
        scores = torch.sigmoid(logits)
        select = scores if expert_bias is None else scores + expert_bias
        idx = torch.topk(limit_to_groups(select, config), k, dim=-1).indices
        probs = scores.gather(-1, idx)
        if k > 1:
            probs = probs / (probs.sum(dim=-1, keepdim=True) + 1e-20)
        full = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)
    else:
        full = torch.softmax(logits, dim=-1)
        if config.moe_router_pre_softmax:
            select = full if expert_bias is None else full + expert_bias
            idx = torch.topk(limit_to_groups(select, config), k, dim=-1).indices
            probs = full.gather(-1, idx)
        else:
            select = logits if expert_bias is None else logits + expert_bias
            idx = torch.topk(limit_to_groups(select, config), k, dim=-1).indices
            probs = torch.softmax(logits.gather(-1, idx), dim=-1)
    if config.moe_router_topk_scaling_factor is not None:
        probs = probs * config.moe_router_topk_scaling_factor
    return probs, idx, full


def _in_backward() -> bool:
    """True while autograd runs a backward pass (an activation-checkpointing recompute of the forward)."""
    return torch._C._current_graph_task_id() != -1


class TopKRouter(nn.Module):
    """Router logits ``x @ weight.T`` in float32, top-k routing, auxiliary losses and the step's expert load.

    Each training forward (not an activation-checkpointing recompute) appends one record of the expert load
    (token-expert assignments per expert) and the auxiliary loss; :attr:`tokens_per_expert` and
    :attr:`aux_loss_sum` / :attr:`aux_loss_count` sum them. The training loop reads the step's last
    ``num_microbatches`` records (:meth:`step_records`; a pipeline schedule's first step also runs a metadata
    forward on placeholder activations, which this leaves out) and resets them after each step.

    Context parallelism (``cp_group`` set by ``apply_context_parallel``): the rank holds a slice of every sequence.
    The load-balancing loss is Megatron's over the tokens of the whole sequence: the expert counts (per sequence for
    ``seq_aux_loss``) are summed over the CP group, ``T`` is the global token count, and the rank's loss is the part
    of the sum its own tokens' scores contribute (the parts of the CP ranks add up to the CP=1 loss); the z-loss is
    the rank's token sum over the global ``T`` likewise. MoE parallel folding (``tp_group`` set by
    ``apply_expert_parallel``) splits each CP slice once more over the TP ranks, handled the same way (counts summed
    over both groups, ``T`` times CP × TP), and the weight's gradient is summed over the TP group.
    """

    def __init__(self, config: ModelConfig, *, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        e = num_experts_of(config)
        self.num_experts = e
        self.weight = nn.Parameter(torch.empty(e, config.hidden_size, device="meta", dtype=dtype))
        self.bias: nn.Parameter | None = None
        if config.add_bias_linear:
            self.bias = nn.Parameter(torch.empty(e, device="meta", dtype=dtype))
        self.expert_bias: torch.Tensor | None
        if config.moe_router_enable_expert_bias:
            self.register_buffer("expert_bias", torch.zeros(e, device="meta", dtype=torch.float32))
        else:
            self.expert_bias = None
        self.cp_group: dist.ProcessGroup | None = None
        """The context-parallel group (CP > 1): aux-loss token counts are summed over it."""
        self.cp_size = 1
        self.tp_group: dist.ProcessGroup | None = None
        """The TP group when its ranks route different tokens (MoE parallel folding), else None."""
        self.tp_split = 1
        self._records: list[tuple[torch.Tensor, float | None]] = []

    def reset_parameters(self, std: float) -> None:
        """``normal(0, std)`` weight (drawn in float32), zero biases and counters."""
        with torch.no_grad():
            if self.weight.dtype == torch.float32:
                self.weight.normal_(0.0, std)
            else:
                self.weight.copy_(torch.empty_like(self.weight, dtype=torch.float32).normal_(0.0, std))
            if self.expert_bias is not None:
                self.expert_bias.zero_()
            if self.bias is not None:
                self.bias.zero_()
        self.reset_step_stats()

    def reset_step_stats(self) -> None:
        """Forget the step's records (expert load and aux losses)."""
        self._records = []

    def step_records(self, last: int | None = None) -> tuple[torch.Tensor, float, float]:
        """Expert load (float64 ``[E]``), aux-loss sum and count of the last ``last`` records (all when None).

        The count is ``1 / token_split`` per record: the CP (and TP) ranks' parts of one micro-batch's loss count
        once."""
        records = self._records if last is None else self._records[-last:] if last > 0 else []
        load = torch.zeros(self.num_experts, dtype=torch.float64)
        aux_sum, aux_count = 0.0, 0.0
        for counts, aux in records:
            load += counts.to("cpu", torch.float64)
            if aux is not None:
                aux_sum += aux
                aux_count += 1.0 / self.token_split
        return load, aux_sum, aux_count

    @property
    def tokens_per_expert(self) -> torch.Tensor:
        """Token-expert assignments per expert since the last reset (float64, CPU)."""
        return self.step_records()[0]

    @property
    def aux_loss_sum(self) -> float:
        """Sum of the recorded auxiliary losses since the last reset."""
        return self.step_records()[1]

    @property
    def aux_loss_count(self) -> float:
        """Number of recorded auxiliary losses since the last reset (CP parts count ``1 / cp_size``)."""
        return self.step_records()[2]

    @property
    def token_split(self) -> int:
        """Ranks whose tokens make up one sequence of the reference: CP × the TP split (1 without either)."""
        return self.cp_size * self.tp_split

    def _sum_over_split(self, counts: torch.Tensor) -> torch.Tensor:
        pairs = ((self.cp_group, self.cp_size), (self.tp_group, self.tp_split))
        groups = [g for g, n in pairs if g is not None and n > 1]
        if not groups:
            return counts
        total = counts.detach().clone()
        for group in groups:
            dist.all_reduce(total, group=group)
        return total

    def _aux_loss(self, logits: torch.Tensor, full: torch.Tensor, idx: torch.Tensor, counts: torch.Tensor,
                  batch: int) -> torch.Tensor | None:
        c, cp = self.config, self.token_split
        aux: torch.Tensor | None = None
        if c.moe_aux_loss_coeff > 0 and c.moe_router_load_balancing_type != "none":
            if c.moe_router_load_balancing_type == "seq_aux_loss":
                seq_counts = F.one_hot(idx.view(batch, -1), self.num_experts).sum(dim=1).float()
                scores = full.view(batch, -1, self.num_experts)
                aux = switch_aux_loss(scores, self._sum_over_split(seq_counts), c.moe_router_topk,
                                      c.moe_aux_loss_coeff, num_tokens=scores.shape[1] * cp)
            else:
                aux = switch_aux_loss(full, self._sum_over_split(counts.float()), c.moe_router_topk,
                                      c.moe_aux_loss_coeff, num_tokens=full.shape[0] * cp)
        if c.moe_z_loss_coeff:
            z_loss = torch.logsumexp(logits, dim=-1).square().sum() / (logits.shape[0] * cp) * c.moe_z_loss_coeff
            aux = z_loss if aux is None else aux + z_loss
        return aux

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``x [b, s, hidden]`` → probs ``[b*s, k]`` (float32), expert ids ``[b*s, k]``, and the auxiliary loss
        (load balancing + z-loss, a float32 scalar; in training mode) or None when neither is on."""
        b, s, h = x.shape
        with torch.autocast(x.device.type, enabled=False):
            weight = local_tensor(self.weight)
            bias = None if self.bias is None else local_tensor(self.bias)
            if self.tp_group is not None and self.tp_split > 1:
                weight = SumGradOver.apply(weight, self.tp_group)
                bias = None if bias is None else SumGradOver.apply(bias, self.tp_group)
            logits = F.linear(x.reshape(b * s, h).float(), weight.float(), None if bias is None else bias.float())
        balance = self.expert_bias.detach() if self.expert_bias is not None else None
        probs, idx, full = route(logits, self.config, balance)
        counts = torch.bincount(idx.reshape(-1), minlength=self.num_experts)
        aux = self._aux_loss(logits, full, idx, counts, b) if self.training else None
        if self.training and not _in_backward():  # not again when activation checkpointing recomputes
            self._records.append((counts.detach(), None if aux is None else float(aux.detach())))
        return probs, idx, aux


class SharedExpertMLP(nn.Module):
    """The shared expert: a SwiGLU MLP of width ``moe_shared_expert_intermediate_size`` every token goes through."""

    def __init__(self, config: ModelConfig, *, dtype: torch.dtype, linear: Callable[..., nn.Linear]) -> None:
        super().__init__()
        h, f = config.hidden_size, config.moe_shared_expert_intermediate_size
        self.gate_proj = linear(h, f, False, dtype=dtype)
        self.up_proj = linear(h, f, False, dtype=dtype)
        self.down_proj = linear(f, h, False, dtype=dtype, output_projection=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., hidden] -> [..., hidden]``."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoELayer(nn.Module):
    """Router → routed experts (+ shared expert); replaces the MLP of MoE layers (module docstring)."""

    def __init__(self, config: ModelConfig, *, dtype: torch.dtype, linear: Callable[..., nn.Linear]) -> None:
        super().__init__()
        self.config = config
        self.router = TopKRouter(config, dtype=dtype)
        self.experts = GroupedExperts(config, dtype=dtype)
        self.shared_experts: SharedExpertMLP | None = None
        if config.moe_shared_expert_intermediate_size:
            self.shared_experts = SharedExpertMLP(config, dtype=dtype, linear=linear)
        self.dispatcher: Dispatcher = local_dispatch
        self.tp_tokens: TokenSplit | None = None
        """Under MoE parallel folding, the TP rank's part of the tokens (module docstring); None: all of them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, s, hidden] -> [b, s, hidden]``."""
        split = self.tp_tokens
        out, aux = self._routed(x if split is None else split.scatter(x))
        if split is not None:
            out = split.gather(out)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x).to(x.dtype)
        if aux is not None and self.training and torch.is_grad_enabled():
            out = AuxLossScaler.apply(out, aux)
        return out

    def _routed(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The routed experts' weighted sum ``[b, s, hidden]`` and the router's auxiliary loss."""
        b, s, h = x.shape
        flat = x.reshape(b * s, h)
        probs, idx, aux = self.router(x)
        k = idx.shape[-1]
        order = torch.argsort(idx.reshape(-1), stable=True)
        token_of = order // k
        counts = torch.bincount(idx.reshape(-1), minlength=self.experts.num_experts)
        expert_out = self.dispatcher(self.experts, flat[token_of], counts)
        weighted = expert_out.float() * probs.reshape(-1)[order].unsqueeze(-1)
        out = torch.zeros(b * s, h, dtype=torch.float32, device=x.device).index_add(0, token_of, weighted)
        return out.to(x.dtype).view(b, s, h), aux


def moe_layers(module: nn.Module) -> list[tuple[int, MoELayer]]:
    """``(layer index, MoELayer)`` of every MoE layer in ``module`` (several chunks: call per chunk)."""
    found = []
    for name, sub in module.named_modules():
        if isinstance(sub, MoELayer):
            idx = next((int(p) for p in reversed(name.split(".")) if p.isdigit()), len(found))
            found.append((idx, sub))
    return found


@torch.no_grad()
def update_expert_bias(router: TopKRouter, global_tokens_per_expert: torch.Tensor) -> None:
    """Aux-loss-free balancing step: ``bias += rate * sign(mean load - load)`` (DeepSeek-V3, Megatron-core)."""
    if router.expert_bias is None:
        return
    load = global_tokens_per_expert.to(router.expert_bias.device, torch.float32)
    offset = load.mean() - load
    router.expert_bias += torch.sign(offset) * router.config.moe_router_bias_update_rate


__all__ = [
    "AuxLossScaler",
    "GroupedExperts",
    "MoELayer",
    "SharedExpertMLP",
    "TopKRouter",
    "grouped_mm",
    "grouped_mm_supported",
    "local_dispatch",
    "limit_to_groups",
    "moe_layers",
    "quick_gelu",
    "route",
    "set_aux_loss_scale",
    "switch_aux_loss",
    "update_expert_bias",
]
