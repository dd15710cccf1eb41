"""Tensor parallelism: plan selection, custom-plan parsing and errors, head-count division, meshes (world size 1).

Numerical TP over 2 ranks is in tests/functional_tests/distributed/test_tensor_parallel_functional.py; here the
plans are applied over a 1-rank TP mesh, where a parallelized model must compute exactly what the plain one does.
"""

import logging

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

from megatron_bridge.distributed.init import data_parallel_rank, split_mesh
from megatron_bridge.distributed.tensor_parallel import (
    ReplicateParallel,
    TiedOutput,
    apply_tensor_parallel,
    divide_attention_heads,
    enable_async_tp,
    install_tied_output,
    llama_tp_plan,
    plan_from_patterns,
    validate_tp_plan,
)
from megatron_bridge.errors import ConfigValidationError
from tests.unit_tests.distributed.helpers import batch, build, tiny_cfg


CPU = torch.device("cpu")


def _model(**model: object) -> nn.Module:
    return build(tiny_cfg(**model))[0]


def _tp_mesh():  # noqa: ANN202
    return init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))


# ------------------------------------------------------------------------------------------------ auto plan
def test_auto_plan_without_sequence_parallel() -> None:
    plan = llama_tp_plan(_model(), sequence_parallel=False)
    for i in range(3):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            assert type(plan[f"layers.{i}.{name}"]) is ColwiseParallel, name
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            style = plan[f"layers.{i}.{name}"]
            assert type(style) is RowwiseParallel and style.output_layouts == (Replicate(),)
        assert isinstance(plan[f"layers.{i}.input_layernorm"], ReplicateParallel)
        assert f"layers.{i}.self_attn" not in plan and f"layers.{i}.self_attn.q_norm" not in plan
    embed, head = plan["embed_tokens"], plan["lm_head"]
    assert type(embed) is RowwiseParallel and embed.input_layouts == (Replicate(),)
    assert embed.output_layouts == (Replicate(),)
    assert type(head) is ColwiseParallel and head.output_layouts == (Replicate(),)
    assert isinstance(plan["norm"], ReplicateParallel)


def test_auto_plan_with_sequence_parallel() -> None:
    plan = llama_tp_plan(_model(qk_layernorm=True), sequence_parallel=True)
    assert plan["embed_tokens"].output_layouts == (Shard(1),)
    assert plan["lm_head"].input_layouts == (Shard(1),) and plan["lm_head"].output_layouts == (Replicate(),)
    assert type(plan["norm"]) is SequenceParallel
    layer = "layers.1"
    assert type(plan[f"{layer}.input_layernorm"]) is SequenceParallel
    assert type(plan[f"{layer}.post_attention_layernorm"]) is SequenceParallel
    assert isinstance(plan[f"{layer}.self_attn"], PrepareModuleInput)
    assert isinstance(plan[f"{layer}.mlp"], PrepareModuleInput)
    assert plan[f"{layer}.self_attn.o_proj"].output_layouts == (Shard(1),)
    assert plan[f"{layer}.mlp.down_proj"].output_layouts == (Shard(1),)
    q_norm = plan[f"{layer}.self_attn.q_norm"]  # per-head norm: local heads on dim 1, local output
    assert type(q_norm) is SequenceParallel and q_norm.sequence_sharding == (Shard(1),) and q_norm.use_local_output


def test_auto_plan_skips_missing_gate_of_gelu_mlp() -> None:
    plan = llama_tp_plan(_model(activation="gelu"), sequence_parallel=False)
    assert "layers.0.mlp.gate_proj" not in plan and "layers.0.mlp.up_proj" in plan


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tied_plan_has_a_vocabulary_parallel_embedding_and_no_lm_head_entry(sequence_parallel: bool) -> None:
    plan = llama_tp_plan(_model(share_embeddings_and_output_weights=True), sequence_parallel=sequence_parallel)
    assert "lm_head" not in plan
    embed = plan["embed_tokens"]
    assert type(embed) is RowwiseParallel and embed.input_layouts == (Replicate(),)
    assert embed.output_layouts == ((Shard(1),) if sequence_parallel else (Replicate(),))


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tied_model_keeps_its_state_dict_and_one_weight(sequence_parallel: bool) -> None:
    cfg = tiny_cfg(share_embeddings_and_output_weights=True, sequence_parallel=sequence_parallel)
    reference, model = build(cfg)[0], build(cfg)[0]
    apply_tensor_parallel(model, _tp_mesh(), cfg)
    assert isinstance(model.lm_head, TiedOutput)
    weight = model.embed_tokens.weight
    assert isinstance(weight, DTensor) and weight.placements == (Shard(0),)  # the column-wise output layout too
    assert model.lm_head.weight is weight and model.output_weight is weight
    state = model.state_dict()
    assert state.keys() == reference.state_dict().keys() and not any(k.startswith("lm_head") for k in state)
    assert all(state[k].shape == v.shape for k, v in reference.state_dict().items())
    assert len(list(model.parameters())) == len(list(reference.parameters()))
    assert not list(model.lm_head.parameters()) and not list(model.lm_head.children())


def test_tied_output_without_dtensor_is_a_plain_linear() -> None:
    embedding = nn.Embedding(8, 4)
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(TiedOutput(embedding, Replicate())(x), x @ embedding.weight.T)
    assert install_tied_output(_model(), sequence_parallel=False) is False  # untied: nothing to install


def test_auto_plan_needs_a_llama_model() -> None:
    with pytest.raises(ConfigValidationError, match="fsdp2.tp_plan"):
        llama_tp_plan(nn.Sequential(nn.Linear(4, 4)), sequence_parallel=False)


@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("model_options", [{}, {"qk_layernorm": True, "activation": "gelu", "add_qkv_bias": True,
                                                "add_bias_linear": True, "normalization": "LayerNorm"},
                                           {"share_embeddings_and_output_weights": True}])
def test_parallelized_model_computes_what_the_plain_model_does(sequence_parallel: bool, model_options: dict) -> None:
    cfg = tiny_cfg(sequence_parallel=sequence_parallel, **model_options)
    reference, model = build(cfg)[0], build(cfg)[0]
    plan = apply_tensor_parallel(model, _tp_mesh(), cfg)
    assert isinstance(model.layers[0].self_attn.q_proj.weight, DTensor)
    assert all(isinstance(p, DTensor) for p in model.parameters()), "every parameter lives on the TP mesh"
    assert set(plan) >= {"embed_tokens", "norm"}
    assert ("lm_head" in plan) != model_options.get("share_embeddings_and_output_weights", False)
    ids = batch()
    expected = reference(ids, labels=ids)
    got = model(ids, labels=ids)
    assert not isinstance(got, DTensor)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    expected.mean().backward()
    got.mean().backward()
    for (name, p), ref in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad.full_tensor(), ref.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_state_dict_keys_and_shapes_are_unchanged() -> None:
    cfg = tiny_cfg(sequence_parallel=True)
    reference, model = build(cfg)[0], build(cfg)[0]
    apply_tensor_parallel(model, _tp_mesh(), cfg)
    state = model.state_dict()
    assert state.keys() == reference.state_dict().keys()
    assert all(state[k].shape == v.shape for k, v in reference.state_dict().items())


# ---------------------------------------------------------------------------------------------- custom plan
CUSTOM = {
    "embed_tokens": "rowwise",
    "layers.*.self_attn.[qkv]_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.mlp.down_proj": "rowwise",
    "layers.*.mlp.*_proj": "colwise",
    "lm_head": "colwise",
    "layers.*norm": "replicate",
}


def test_custom_plan_resolves_patterns_first_match_wins() -> None:
    plan = plan_from_patterns(_model(), CUSTOM, sequence_parallel=False)
    assert type(plan["layers.2.self_attn.k_proj"]) is ColwiseParallel
    assert type(plan["layers.2.mlp.down_proj"]) is RowwiseParallel  # the earlier "rowwise" pattern wins
    assert type(plan["layers.2.mlp.gate_proj"]) is ColwiseParallel
    assert plan["embed_tokens"].input_layouts == (Replicate(),)  # an embedding takes token ids
    assert plan["lm_head"].output_layouts == (Replicate(),)  # the loss needs the full logits
    assert isinstance(plan["layers.0.input_layernorm"], ReplicateParallel)
    assert isinstance(plan["norm"], ReplicateParallel)  # left out of the plan: replicated


def test_custom_plan_with_sequence_parallel_layouts() -> None:
    plan = plan_from_patterns(_model(qk_layernorm=True), {**CUSTOM, "layers.*norm": "sequence_parallel",
                                                         "norm": "sequence_parallel"}, sequence_parallel=True)
    assert plan["layers.0.self_attn.q_proj"].input_layouts == (Shard(1),)
    assert plan["layers.0.self_attn.o_proj"].output_layouts == (Shard(1),)
    assert plan["embed_tokens"].output_layouts == (Shard(1),)
    assert type(plan["norm"]) is SequenceParallel
    assert plan["layers.0.self_attn.q_norm"].use_local_output  # per-head norm follows the head split


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_custom_plan_computes_what_the_plain_model_does(sequence_parallel: bool) -> None:
    cfg = tiny_cfg(sequence_parallel=sequence_parallel)
    cfg.fsdp2.tp_plan = {"*norm": "sequence_parallel" if sequence_parallel else "replicate", **CUSTOM}
    reference, model = build(cfg)[0], build(cfg)[0]
    apply_tensor_parallel(model, _tp_mesh(), cfg)
    ids = batch()
    torch.testing.assert_close(model(ids, labels=ids), reference(ids, labels=ids), rtol=1e-6, atol=1e-6)


def test_unknown_style_names_the_entry() -> None:
    with pytest.raises(ConfigValidationError, match=r"fsdp2.tp_plan\['lm_head'\]='diagonal'") as info:
        validate_tp_plan({"layers.*.q_proj": "colwise", "lm_head": "diagonal"}, sequence_parallel=False)
    assert info.value.paths == ("fsdp2.tp_plan",)
    assert "colwise, rowwise, sequence_parallel, replicate" in str(info.value)


def test_sequence_parallel_style_needs_sequence_parallel() -> None:
    with pytest.raises(ConfigValidationError, match="model.sequence_parallel=True"):
        validate_tp_plan({"norm": "sequence_parallel"}, sequence_parallel=False)


def test_plan_must_be_a_dict_and_match_something(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigValidationError,
                       match=r"fsdp2.tp_plan='llama' is not dict\[str, str\] or None \[rule field_types\]"):
        validate_tp_plan("llama", sequence_parallel=False)  # type: ignore[arg-type]
    with pytest.raises(ConfigValidationError, match="matches no module"):
        plan_from_patterns(_model(), {"model.layers.*.q_proj": "colwise"}, sequence_parallel=False)
    with caplog.at_level(logging.WARNING):
        plan_from_patterns(_model(), {**CUSTOM, "blocks.*.wq": "colwise"}, sequence_parallel=False)
    assert any("blocks.*.wq" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------------------------- attention heads
def test_head_counts_are_divided_by_tp() -> None:
    model = _model(num_attention_heads=4, num_query_groups=2)
    plan = llama_tp_plan(model, sequence_parallel=False)
    assert divide_attention_heads(model, plan, 2) == 3
    attn = model.layers[0].self_attn
    assert (attn.num_heads, attn.num_kv_heads, attn.head_dim) == (2, 1, 8)


def test_unsharded_attention_keeps_its_heads() -> None:
    model = _model()
    assert divide_attention_heads(model, {"layers.0.mlp.up_proj": ColwiseParallel()}, 2) == 0
    assert model.layers[0].self_attn.num_heads == 4


def test_partly_sharded_attention_is_rejected() -> None:
    model = _model()
    plan = plan_from_patterns(model, {"layers.*.self_attn.q_proj": "colwise"}, sequence_parallel=False)
    with pytest.raises(ConfigValidationError, match="q_proj, k_proj and v_proj"):
        divide_attention_heads(model, plan, 2)


def test_heads_not_divisible_by_tp_are_rejected() -> None:
    model = _model(num_attention_heads=4, num_query_groups=1)
    with pytest.raises(ConfigValidationError, match="num_kv_heads=1"):
        divide_attention_heads(model, llama_tp_plan(model, sequence_parallel=False), 2)


# ------------------------------------------------------------------------------------ config checks and meshes
@pytest.mark.parametrize(("options", "path"), [({"ffn_hidden_size": 63}, "model.ffn_hidden_size"),
                                               ({"sequence_parallel": True, "seq_length": 15}, "model.seq_length")])
def test_sizes_must_divide_by_tp(options: dict, path: str) -> None:
    cfg = tiny_cfg(tensor_model_parallel_size=2, **options)
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    mesh_of_two = type("Mesh", (), {"size": lambda self: 2})()  # only the size is read before the size checks
    with pytest.raises(ConfigValidationError, match=path) as info:
        apply_tensor_parallel(build(tiny_cfg())[0], mesh_of_two, cfg)  # type: ignore[arg-type]
    assert path in info.value.paths
    with pytest.raises(ConfigValidationError, match="the TP mesh has 1 ranks"):
        apply_tensor_parallel(build(tiny_cfg())[0], mesh, cfg)


def test_megatron_fsdp_takes_tp_but_not_expert_tp() -> None:
    from megatron_bridge.recipes import tiny_llama_pretrain_config

    cfg = tiny_llama_pretrain_config(tensor_model_parallel_size=2, use_megatron_fsdp=True)
    cfg.validate(world_size=2)
    cfg.model.num_moe_experts = 4  # ETP None means TP: the experts would be split over TP
    with pytest.raises(ConfigValidationError, match=r"expert_tensor_parallel_size=1.*"
                       r"\[rule megatron_fsdp_expert_tensor_parallel\]"):
        cfg.validate(world_size=2)
    cfg.model.expert_tensor_parallel_size = 1
    cfg.validate(world_size=2)


def test_async_tp_is_a_logged_no_op_on_cpu(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert enable_async_tp(_tp_mesh()) is False
    assert any("no-op on cpu" in r.getMessage() for r in caplog.records)


def test_split_mesh_and_data_parallel_rank() -> None:
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    dp, tp = split_mesh(mesh)
    assert dp.mesh_dim_names == ("dp",) and tp is not None and tp.mesh_dim_names == ("tp",)
    one_d = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    assert split_mesh(one_d) == (one_d, None)
    cfg = tiny_cfg(tensor_model_parallel_size=2)
    # (dp, tp) with TP innermost: ranks 0,1 are one TP group (dp rank 0), ranks 2,3 the next (dp rank 1).
    assert [data_parallel_rank(cfg, r, 4) for r in range(4)] == [0, 0, 1, 1]
    assert [data_parallel_rank(tiny_cfg(), r, 4) for r in range(4)] == [0, 1, 2, 3]


def test_lm_head_module_produces_the_logits() -> None:
    model = _model()
    calls: list[int] = []
    model.lm_head.register_forward_hook(lambda *args: calls.append(1))
    model(batch())
    assert calls == [1]
