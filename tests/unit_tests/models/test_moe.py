"""The MoE layer against a dense per-token reference, the auxiliary losses and the expert-bias update against
hand-computed values, uneven routing, grouped matmuls, FLOPs/parameter counts and the tiny MoE recipe.

Tolerance of the reference comparisons (float32): outputs and gradients within 1e-6 absolute.
"""

import math

import pytest
import torch
from torch.nn import functional as F

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.engines.native.moe_stats import MoETracker
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.models.flops import num_floating_point_operations, num_parameters
from megatron_bridge.models.llama import LlamaMLP, LlamaModel, _linear
from megatron_bridge.models.moe import (
    AuxLossScaler,
    MoELayer,
    grouped_mm,
    grouped_mm_supported,
    route,
    set_aux_loss_scale,
    switch_aux_loss,
    update_expert_bias,
)


ATOL = 1e-6
H, E = 16, 6


def moe_config(**overrides: object) -> ModelConfig:
    base: dict[str, object] = {"num_layers": 2, "hidden_size": H, "ffn_hidden_size": 24, "num_attention_heads": 2,
                               "num_moe_experts": E, "moe_ffn_hidden_size": 12, "moe_router_topk": 2}
    base.update(overrides)
    return ModelConfig(**base)  # type: ignore[arg-type]


def build_layer(config: ModelConfig, seed: int = 0) -> MoELayer:
    """An MoE layer on CPU with random weights (router scaled up so that routing is far from ties)."""
    torch.manual_seed(seed)
    layer = MoELayer(config, dtype=torch.float32, linear=_linear)
    layer.to_empty(device="cpu")
    layer.router.reset_parameters(0.5)
    layer.experts.reset_parameters(0.2, 0.2)
    if layer.shared_experts is not None:
        for lin in (layer.shared_experts.gate_proj, layer.shared_experts.up_proj, layer.shared_experts.down_proj):
            torch.nn.init.normal_(lin.weight, 0.0, 0.1)
    return layer


def dense_reference(layer: MoELayer, x: torch.Tensor) -> torch.Tensor:
    """Token by token: the weighted sum of its k experts' SwiGLU outputs (+ the shared expert), same routing."""
    b, s, h = x.shape
    probs, idx, _ = layer.router(x)
    ex = layer.experts
    rows = []
    for t, token in enumerate(x.reshape(b * s, h)):
        out = torch.zeros(h)
        for j in range(idx.shape[1]):
            e = int(idx[t, j])
            hidden = F.silu(token @ ex.gate_proj[e]) * (token @ ex.up_proj[e])
            out = out + probs[t, j] * (hidden @ ex.down_proj[e])
        if layer.shared_experts is not None:
            out = out + layer.shared_experts(token)
        rows.append(out)
    return torch.stack(rows).view(b, s, h)


CASES = {
    "softmax over top-k, loop": {},
    "softmax over top-k, grouped mm": {"moe_grouped_gemm": True},
    "pre-softmax top-k": {"moe_router_pre_softmax": True, "moe_router_topk": 3},
    "sigmoid, normalised top-k, scaling": {"moe_router_score_function": "sigmoid",
                                           "moe_router_topk_scaling_factor": 2.5,
                                           "moe_grouped_gemm": True},
    "shared expert, top-1": {"moe_shared_expert_intermediate_size": 20, "moe_router_topk": 1},
    "expert bias": {"moe_router_enable_expert_bias": True},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_moe_layer_matches_dense_reference(name: str) -> None:
    config = moe_config(**CASES[name])
    layer = build_layer(config)
    if layer.router.expert_bias is not None:
        layer.router.expert_bias.copy_(torch.linspace(-0.3, 0.3, E))
    x = torch.randn(2, 5, H, generator=torch.Generator().manual_seed(1), requires_grad=True)
    grad_out = 0.5 * torch.randn(2, 5, H, generator=torch.Generator().manual_seed(2))

    out = layer(x)
    grads = torch.autograd.grad(out, [x, *layer.parameters()], grad_out)
    ref = dense_reference(layer, x)
    ref_grads = torch.autograd.grad(ref, [x, *layer.parameters()], grad_out)

    assert (out - ref).abs().max() <= ATOL
    for (pname, _), g, r in zip([("x", x), *layer.named_parameters()], grads, ref_grads, strict=True):
        assert (g - r).abs().max() <= ATOL, pname
    assert layer.router.weight.shape == (E, H)


def test_routing_rules_by_hand() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    # softmax over the 2 selected logits: e^2/(e^2+e^1), e^1/(...)
    probs, idx, full = route(logits, moe_config(num_moe_experts=4), None)
    assert idx.tolist() == [[0, 1]]
    assert probs[0].tolist() == pytest.approx([1 / (1 + math.e ** -1), 1 / (1 + math.e)], abs=1e-7)
    assert full.sum().item() == pytest.approx(1.0)
    # pre-softmax: the top-2 of the full softmax, not renormalised
    probs, _, _ = route(logits, moe_config(num_moe_experts=4, moe_router_pre_softmax=True), None)
    z = sum(math.exp(v) for v in (2.0, 1.0, 0.0, -1.0))
    assert probs[0].tolist() == pytest.approx([math.exp(2) / z, math.exp(1) / z], abs=1e-7)
    # sigmoid: selected scores divided by their sum; the bias changes the choice, not the weights
    sig = moe_config(num_moe_experts=4, moe_router_score_function="sigmoid")
    bias = torch.tensor([0.0, 0.0, 5.0, 0.0])
    probs, idx, _ = route(logits, sig, bias)
    s0, s2 = 1 / (1 + math.exp(-2.0)), 0.5
    assert sorted(idx[0].tolist()) == [0, 2]
    assert dict(zip(idx[0].tolist(), probs[0].tolist())) == pytest.approx({0: s0 / (s0 + s2), 2: s2 / (s0 + s2)})


def test_aux_loss_and_z_loss_by_hand() -> None:
    """Router weight = identity, so the logits are the inputs; 4 tokens, 3 experts, top-1."""
    config = moe_config(hidden_size=3, num_moe_experts=3, moe_router_topk=1, moe_aux_loss_coeff=0.1,
                        moe_z_loss_coeff=0.01, num_attention_heads=1)
    layer = build_layer(config)
    with torch.no_grad():
        layer.router.weight.copy_(torch.eye(3))
    rows = [[1.0, 0.0, 0.0], [2.0, 0.0, 1.0], [0.0, 3.0, 0.0], [0.5, 0.0, 0.0]]
    x = torch.tensor([rows])
    _, idx, aux = layer.router(x)
    assert idx.view(-1).tolist() == [0, 0, 1, 0]  # counts [3, 1, 0]: expert 2 gets no token
    softmax = [[math.exp(v) / sum(math.exp(u) for u in r) for v in r] for r in rows]
    prob_sums = [sum(p[e] for p in softmax) for e in range(3)]
    counts = [3, 1, 0]
    lb = 0.1 * 3 / (1 * 4 * 4) * sum(c * p for c, p in zip(counts, prob_sums, strict=True))
    z = 0.01 * sum(math.log(sum(math.exp(v) for v in r)) ** 2 for r in rows) / 4
    assert aux is not None and aux.item() == pytest.approx(lb + z, rel=1e-6)
    assert switch_aux_loss(torch.tensor(softmax), torch.tensor([3.0, 1.0, 0.0]), 1, 0.1).item() == pytest.approx(lb)


def test_aux_loss_gradient_scaled_into_router() -> None:
    """The output's gradient is untouched; the router gets ``scale * d(aux)/dW`` on top of the main loss."""
    config = moe_config(moe_aux_loss_coeff=0.5)
    layer = build_layer(config)
    x = torch.randn(1, 6, H, generator=torch.Generator().manual_seed(3))
    try:
        set_aux_loss_scale(0.25)
        layer(x).sum().mul(0).backward()  # only the aux loss contributes
        got = layer.router.weight.grad.clone()
    finally:
        set_aux_loss_scale(1.0)
    layer.zero_grad()
    _, _, aux = layer.router(x)
    (aux * 0.25).backward()
    assert torch.allclose(got, layer.router.weight.grad, atol=1e-9, rtol=0)
    assert got.abs().sum() > 0
    assert AuxLossScaler.scale == 1.0


@pytest.mark.parametrize("split", ["cp", "tp"])
@pytest.mark.parametrize("balancing", ["aux_loss", "seq_aux_loss"])
def test_context_parallel_aux_loss_parts_add_up(balancing: str, split: str) -> None:
    """Under CP (or the TP split of MoE parallel folding) a rank holds a slice of every sequence: with the counts of
    the whole sequence and its length, the parts each slice's scores contribute (load balancing and z-loss) add up
    to the loss of the whole sequence."""
    config = moe_config(moe_aux_loss_coeff=0.1, moe_z_loss_coeff=0.01, moe_router_load_balancing_type=balancing)
    layer = build_layer(config)
    x = torch.randn(3, 8, H, generator=torch.Generator().manual_seed(11))
    _, _, whole = layer.router(x)
    halves = [x[:, [0, 1, 6, 7]], x[:, [2, 3, 4, 5]]]  # the zig-zag slices of CP=2
    if balancing == "seq_aux_loss":
        global_counts = sum(F.one_hot(layer.router(h)[1].view(3, -1), E).sum(dim=1).float() for h in halves)
    else:
        global_counts = sum(torch.bincount(layer.router(h)[1].view(-1), minlength=E).float() for h in halves)
    layer.router._sum_over_split = lambda counts: global_counts  # type: ignore[method-assign]  # the all-reduce
    if split == "cp":
        layer.router.cp_size = 2
    else:
        layer.router.tp_split = 2
    parts = [layer.router(h)[2] for h in halves]
    assert (parts[0] + parts[1]).item() == pytest.approx(whole.item(), rel=1e-6)
    assert parts[0].item() != pytest.approx(parts[1].item(), rel=1e-3)  # the slices differ: a real test
    _, _, count = layer.router.step_records(2)
    assert count == pytest.approx(1.0)  # the two parts of one micro-batch count as one aux loss


def test_tracker_merges_pipeline_stages_with_different_moe_layers() -> None:
    """Stages hold different MoE layers (one none): every rank builds the same table over the model's MoE layers,
    fills its own rows, and only the last ``num_microbatches`` forward records count (the pipeline schedule's
    metadata forward is left out)."""
    config = moe_config(num_layers=4, moe_layer_freq=[0, 1, 1, 1], moe_aux_loss_coeff=0.1)
    layers = {i: build_layer(config, seed=i) for i in (1, 2, 3)}
    empty = MoETracker.for_chunks([torch.nn.Linear(2, 2)], torch.device("cpu"), 1, config)
    assert empty is not None and empty.layers == [] and empty.layer_ids == [1, 2, 3]
    stage = MoETracker([(2, layers[2]), (3, layers[3])], torch.device("cpu"), 1, [1, 2, 3], E)
    x = torch.randn(2, 4, H, generator=torch.Generator().manual_seed(12))
    layers[3].router(torch.randn(2, 4, H))  # a placeholder (metadata) forward before the step
    expected = {}
    for i in (2, 3):
        _, idx, _ = layers[i].router(x)
        expected[i] = torch.bincount(idx.view(-1), minlength=E).tolist()
    stage.begin_step(1)
    stats = stage.end_step()
    assert stats.tokens_per_expert[1] == [0.0] * E and 1 not in stats.layer_aux_loss
    assert stats.tokens_per_expert[2] == expected[2] and stats.tokens_per_expert[3] == expected[3]
    assert empty.end_step(1).tokens_per_expert == {1: [0.0] * E, 2: [0.0] * E, 3: [0.0] * E}


def test_seq_aux_loss_is_mean_of_per_sequence_losses() -> None:
    config = moe_config(moe_aux_loss_coeff=0.1, moe_router_load_balancing_type="seq_aux_loss")
    layer = build_layer(config)
    x = torch.randn(3, 5, H, generator=torch.Generator().manual_seed(4))
    _, _, aux = layer.router(x)
    per_seq = []
    for seq in x:
        logits = seq @ layer.router.weight.T
        _, idx, full = route(logits, config, None)
        per_seq.append(switch_aux_loss(full, torch.bincount(idx.view(-1), minlength=E).float(), 2, 0.1))
    assert aux.item() == pytest.approx(torch.stack(per_seq).mean().item(), rel=1e-6)


def test_expert_bias_update_by_hand() -> None:
    layer = build_layer(moe_config(moe_router_enable_expert_bias=True, moe_router_bias_update_rate=0.01))
    update_expert_bias(layer.router, torch.tensor([5.0, 1.0, 2.0, 2.0, 2.0, 0.0]))  # mean 2
    assert layer.router.expert_bias.tolist() == pytest.approx([-0.01, 0.01, 0.0, 0.0, 0.0, 0.01])


def test_tracker_counts_steps_and_updates_bias() -> None:
    """One step of two micro-batches: counts summed, bias moved by the sign rule, accumulators reset."""
    layer = build_layer(moe_config(moe_router_enable_expert_bias=True, moe_aux_loss_coeff=0.1))
    tracker = MoETracker([(3, layer)], torch.device("cpu"), model_copies=1)
    expected = torch.zeros(E)
    aux_values = []
    for seed in (5, 6):
        x = torch.randn(2, 4, H, generator=torch.Generator().manual_seed(seed))
        _, idx, aux = layer.router(x)
        expected += torch.bincount(idx.view(-1), minlength=E).float()
        aux_values.append(aux.item())
    stats = tracker.end_step()
    assert stats.tokens_per_expert[3] == expected.tolist() and sum(expected.tolist()) == 2 * 8 * 2
    assert stats.aux_loss == pytest.approx(sum(aux_values) / 2)
    want = 1e-3 * torch.sign(expected.mean() - expected)
    assert torch.equal(layer.router.expert_bias, want)
    assert layer.router.tokens_per_expert.sum() == 0 and layer.router.aux_loss_count == 0


def test_uneven_routing_all_tokens_to_one_expert() -> None:
    """A large bias sends every token to expert 4 (top-1): the others get zero tokens; outputs and gradients still
    match the reference, and the idle experts get zero gradients."""
    for grouped in (False, True):
        config = moe_config(moe_router_topk=1, moe_router_enable_expert_bias=True, moe_grouped_gemm=grouped)
        layer = build_layer(config)
        layer.router.expert_bias.copy_(torch.tensor([0, 0, 0, 0, 100.0, 0]))
        x = torch.randn(2, 3, H, generator=torch.Generator().manual_seed(7))
        out = layer(x)
        _, idx, _ = layer.router(x)
        assert idx.unique().tolist() == [4]
        assert (out - dense_reference(layer, x)).abs().max() <= ATOL
        out.sum().backward()
        grad = layer.experts.gate_proj.grad
        assert grad[4].abs().sum() > 0 and grad[[0, 1, 2, 3, 5]].abs().sum() == 0


def test_grouped_mm_matches_loop_with_empty_groups() -> None:
    counts = torch.tensor([0, 4, 0, 3])
    for width, out in ((8, 4), (5, 3)):  # 16-byte aligned rows use torch._grouped_mm; others fall back to the loop
        x = torch.randn(7, width, generator=torch.Generator().manual_seed(8))
        w = torch.randn(4, width, out, generator=torch.Generator().manual_seed(9))
        loop = grouped_mm(x, w, counts, grouped=False)
        assert torch.allclose(grouped_mm(x, w, counts, grouped=True), loop, atol=1e-6, rtol=0)
        assert torch.equal(loop[:4], x[:4] @ w[1])
    assert grouped_mm_supported(torch.zeros(2, 8), torch.zeros(4, 8, 4))
    assert not grouped_mm_supported(x, w) and not grouped_mm_supported(torch.zeros(0, 8), torch.zeros(4, 8, 4))
    empty = grouped_mm(x[:0], w, torch.zeros(4, dtype=torch.long), grouped=True)  # falls back: no rows
    assert empty.shape == (0, 3)


def test_layer_pattern_and_model_structure() -> None:
    first_dense = moe_config(num_layers=4, moe_layer_freq=[0, 1, 1, 1])
    assert first_dense.moe_layer_pattern() == [False, True, True, True]
    assert moe_config(num_layers=5, moe_layer_freq=2).moe_layer_pattern() == [True, False, True, False, True]
    assert not any(ModelConfig(num_layers=3).moe_layer_pattern())
    model = LlamaModel(first_dense, device="cpu")
    assert isinstance(model.layers[0].mlp, LlamaMLP) and isinstance(model.layers[1].mlp, MoELayer)
    assert sum(p.numel() for p in model.parameters()) == num_parameters(first_dense)


def test_flops_count_only_active_experts() -> None:
    dense = moe_config(num_moe_experts=None, moe_ffn_hidden_size=None, seq_length=8)
    moe = moe_config(seq_length=8, moe_shared_expert_intermediate_size=10)
    h, f, k, s = H, 12, 2, 8
    per_token_layer = 2 * h * E + k * 3 * 2 * h * f + 3 * 2 * h * 10 - 3 * 2 * h * 24  # MoE minus dense MLP
    diff = num_floating_point_operations(moe, 1) - num_floating_point_operations(dense, 1)
    assert diff == 3 * 2 * per_token_layer * s  # 2 layers, fwd+bwd
    more_experts = moe_config(seq_length=8, moe_shared_expert_intermediate_size=10, num_moe_experts=12)
    extra_router = 3 * 2 * (2 * h * 6) * s
    assert num_floating_point_operations(more_experts, 1) - num_floating_point_operations(moe, 1) == extra_router
    assert num_parameters(moe, active_only=True) == num_parameters(moe) - 2 * (E - k) * 3 * h * f


def test_layer_on_meta_needs_num_experts() -> None:
    with pytest.raises(ConfigValidationError, match="num_moe_experts"):
        MoELayer(ModelConfig(), dtype=torch.float32, linear=_linear)


def test_moe_fields_without_experts_are_refused() -> None:
    cfg = ConfigContainer(model=ModelConfig(moe_ffn_hidden_size=64))
    with pytest.raises(ConfigValidationError, match="moe_router") as info:
        cfg.validate(world_size=1)
    assert "model.moe_ffn_hidden_size" in info.value.paths


def test_tiny_moe_recipe_trains_a_step_in_process() -> None:
    from megatron_bridge.recipes import tiny_moe_pretrain_config
    from megatron_bridge.training.pretrain import pretrain

    cfg = tiny_moe_pretrain_config(expert_model_parallel_size=1, train_iters=2, global_batch_size=4,
                                   micro_batch_size=2, seq_length=32, lr_warmup_iters=1)
    cfg.checkpoint.save = cfg.checkpoint.load = None
    cfg.validation.eval_interval = None
    result = pretrain(cfg)
    assert result.final_step == 2 and all(math.isfinite(v) for v in result.losses)


@pytest.mark.parametrize("name", ["qwen3_30b_a3b", "qwen3_235b_a22b"])
def test_qwen3_moe_recipes_shrunk_run_one_step(name: str) -> None:
    """The recipe validates at its world size with Megatron-Bridge's layout, then, shrunk to a few MB and laid out
    for one process, builds and trains one step on CPU."""
    from megatron_bridge.recipes import RECIPES
    from megatron_bridge.training.pretrain import pretrain

    info = RECIPES[name]
    full = info.fn()
    assert full.model.num_moe_experts == 128 and full.model.moe_router_topk == 8 and full.model.moe_grouped_gemm
    full.validate(world_size=info.world_size)
    cfg = info.fn(train_iters=1, global_batch_size=2, micro_batch_size=1, seq_length=32, mixed_precision="fp32",
                  tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
                  expert_model_parallel_size=1, sequence_parallel=False, lr_warmup_iters=0)
    m = cfg.model
    m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.kv_channels = 2, 64, 4, 2, 16
    m.ffn_hidden_size, m.moe_ffn_hidden_size, m.num_moe_experts, m.vocab_size = 96, 32, 8, 512
    cfg.tokenizer.vocab_size = m.vocab_size
    cfg.validation.eval_interval = None
    cfg.checkpoint.save = cfg.checkpoint.load = None
    result = pretrain(cfg)
    assert result.final_step == 1 and math.isfinite(result.losses[0])


def test_recomputed_forward_is_not_counted_twice() -> None:
    """Under activation checkpointing the router runs again in backward: the step's load and aux loss count once."""
    from torch.utils.checkpoint import checkpoint

    layer = build_layer(moe_config(moe_aux_loss_coeff=0.1))
    x = torch.randn(1, 4, H, generator=torch.Generator().manual_seed(10), requires_grad=True)
    checkpoint(layer, x, use_reentrant=False).sum().backward()
    assert layer.router.tokens_per_expert.sum().item() == 4 * 2 and layer.router.aux_loss_count == 1


def test_moe_layouts_with_pipeline_and_context_parallel_validate() -> None:
    """MoE composes with PP and CP; EP is carved out of data-parallel × CP ranks, and a size that does not divide
    them is refused naming the fields."""
    from megatron_bridge.recipes import tiny_moe_pretrain_config

    def cfg(**layout: int) -> ConfigContainer:
        c = tiny_moe_pretrain_config(**layout)
        c.model.num_layers = 4
        return c

    cfg(pipeline_model_parallel_size=2, expert_model_parallel_size=2).validate(world_size=4)
    cfg(context_parallel_size=2, expert_model_parallel_size=2).validate(world_size=2)  # EP over the CP ranks
    cfg(pipeline_model_parallel_size=2, context_parallel_size=2, expert_model_parallel_size=2).validate(world_size=4)
    with pytest.raises(ConfigValidationError, match=r"\[rule expert_parallel_layout\]") as info:
        cfg(context_parallel_size=2, expert_model_parallel_size=4).validate(world_size=2)
    assert "model.expert_model_parallel_size" in info.value.paths and "model.context_parallel_size" in info.value.paths
    cfg(use_megatron_fsdp=True, expert_model_parallel_size=2).validate(world_size=2)  # native: experts on edp
    with pytest.raises(ConfigValidationError, match=r"\[rule moe_backend\]"):
        mcore = cfg(use_megatron_fsdp=True)
        mcore.model.engine = "megatron_core"
        mcore.validate(world_size=2)


def test_qwen3_235b_layout_shrunk_validates_and_builds() -> None:
    """Megatron-Bridge's 235B layout (TP4 PP16 CP2 EP8, embedding and loss counted in the pipeline split), shrunk to 6
    layers on PP4 × CP2 × EP2 (8 ranks): it validates, and every stage builds with the layers the split gives it
    (6 + 2 = 4 stages × 2: the first holds the embedding and 1 layer, the last 1 layer and the output layer)."""
    from megatron_bridge.models.moe import MoELayer
    from megatron_bridge.models.pipeline_stage import build_pipeline_chunks
    from megatron_bridge.recipes import qwen3_235b_a22b_pretrain_config

    cfg = qwen3_235b_a22b_pretrain_config(seq_length=32, tensor_model_parallel_size=1, pipeline_model_parallel_size=4,
                                          expert_model_parallel_size=2, sequence_parallel=False,
                                          mixed_precision="fp32", global_batch_size=4, micro_batch_size=1)
    m = cfg.model
    assert m.account_for_embedding_in_pipeline_split and m.account_for_loss_in_pipeline_split
    assert (m.context_parallel_size, m.pipeline_dtype) == (2, "bfloat16")
    m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.kv_channels = 6, 64, 4, 2, 16
    m.ffn_hidden_size, m.moe_ffn_hidden_size, m.num_moe_experts, m.vocab_size = 96, 32, 8, 512
    cfg.tokenizer.vocab_size = m.vocab_size
    cfg.validate(world_size=8)
    layers = []
    for pp_rank in range(4):
        (stage,) = build_pipeline_chunks(m, pp_rank, device="cpu")
        held = sorted(int(k) for k in stage.layers)
        layers.append(held)
        assert (stage.embed_tokens is not None) == (pp_rank == 0) and (stage.lm_head is not None) == (pp_rank == 3)
        assert all(isinstance(stage.layers[str(i)].mlp, MoELayer) for i in held)
    assert layers == [[0], [1, 2], [3, 4], [5]]
