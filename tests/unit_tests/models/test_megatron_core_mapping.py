"""The megatron-core engine's option mappings: model fields → ``TransformerConfig`` and layer spec, ``cfg.ddp`` →
``DistributedDataParallelConfig``, ``cfg.optimizer`` → ``OptimizerConfig``; its validation errors; and that the
native engine never imports megatron-core. Nothing here builds a model (that needs CUDA or the functional tests'
harness: tests/functional_tests/training/test_megatron_core_engine.py)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.recipes import qwen3_8b_pretrain_config, tiny_llama_pretrain_config


pytest.importorskip("megatron.core", reason="the megatron-core engine needs megatron-core (Python 3.12 environment)")

from megatron_bridge.engines.megatron_core.ddp import ddp_config  # noqa: E402
from megatron_bridge.engines.megatron_core.optimizer import optimizer_config  # noqa: E402
from megatron_bridge.engines.megatron_core.parallel_state import MegatronCoreNeedsCudaError, require_cuda  # noqa: E402
from megatron_bridge.engines.megatron_core.provider import layer_spec, transformer_config  # noqa: E402


CPU = torch.device("cpu")


def test_llama_fields_map_to_transformer_config() -> None:
    cfg = tiny_llama_pretrain_config()
    m = cfg.model
    tc = transformer_config(m, CPU)
    assert (tc.num_layers, tc.hidden_size, tc.ffn_hidden_size) == (m.num_layers, m.hidden_size, m.ffn_hidden_size)
    assert (tc.num_attention_heads, tc.num_query_groups, tc.kv_channels) == (4, 2, 32)  # GQA 4/2
    assert tc.normalization == "RMSNorm" and tc.layernorm_epsilon == m.layernorm_epsilon
    assert tc.gated_linear_unit and tc.activation_func is F.silu  # SwiGLU
    assert not tc.add_bias_linear and not tc.add_qkv_bias and not tc.qk_layernorm
    assert tc.hidden_dropout == 0.0 and tc.attention_dropout == 0.0
    assert tc.params_dtype == torch.float32 and tc.use_cpu_initialization
    assert not transformer_config(m, torch.device("cuda", 0)).use_cpu_initialization


def test_qwen3_and_gpt_variants_map() -> None:
    q = qwen3_8b_pretrain_config().model
    tc = transformer_config(q, CPU)
    assert tc.qk_layernorm and tc.kv_channels == q.head_dim and tc.num_query_groups == q.num_kv_heads
    assert tc.tensor_model_parallel_size == q.tensor_model_parallel_size
    m = tiny_llama_pretrain_config().model
    m.activation, m.normalization, m.add_bias_linear, m.add_qkv_bias = "gelu", "LayerNorm", True, True
    tc = transformer_config(m, CPU)
    assert not tc.gated_linear_unit and tc.activation_func is F.gelu and tc.normalization == "LayerNorm"
    assert tc.add_bias_linear and tc.add_qkv_bias


def test_local_layer_spec_has_qk_norm_only_when_asked() -> None:
    from megatron.core.transformer.identity_op import IdentityOp

    m = tiny_llama_pretrain_config().model
    plain = layer_spec(m).submodules.self_attention.submodules
    assert plain.q_layernorm is IdentityOp and plain.k_layernorm is IdentityOp
    m.qk_layernorm = True
    normed = layer_spec(m).submodules.self_attention.submodules
    assert normed.q_layernorm is not IdentityOp and normed.k_layernorm is not IdentityOp


def test_cp_comm_type_reaches_transformer_config() -> None:
    m = tiny_llama_pretrain_config().model
    assert transformer_config(m, CPU).cp_comm_type == "all_gather"  # this library's default, not megatron-core's None
    m.cp_comm_type = "p2p"
    assert transformer_config(m, CPU).cp_comm_type == "p2p"


def test_deterministic_mode_reaches_transformer_config() -> None:
    m = tiny_llama_pretrain_config().model
    assert transformer_config(m, CPU).deterministic_mode is False
    m.deterministic_mode = True
    assert transformer_config(m, CPU).deterministic_mode is True


def test_torch_ddp_options_are_refused_naming_the_equivalent() -> None:
    cfg = tiny_llama_pretrain_config()
    cfg.model.engine, cfg.ddp.bucket_cap_mb, cfg.ddp.static_graph = "megatron_core", 25.0, True
    with pytest.raises(ConfigValidationError) as err:
        cfg.validate(world_size=1)
    message = str(err.value)
    assert "ddp.bucket_cap_mb=25.0" in message and "ddp.bucket_size" in message and "bucket_size, counted" in message
    assert "ddp.static_graph=True" in message and "[rule megatron_core_ddp_options]" in message
    assert set(err.value.paths) >= {"ddp.bucket_cap_mb", "ddp.static_graph"}
    cfg.ddp.bucket_cap_mb, cfg.ddp.static_graph, cfg.ddp.bucket_size = None, False, 40_000_000
    assert ddp_config(cfg.validate(world_size=1)).bucket_size == 40_000_000


def test_ddp_options_map_to_megatron_core_ddp_config() -> None:
    cfg = tiny_llama_pretrain_config()
    d = cfg.ddp
    d.grad_reduce_in_fp32, d.overlap_grad_reduce, d.overlap_param_gather = True, True, True
    d.use_distributed_optimizer, d.check_for_nan_in_grad, d.bucket_size, d.average_in_collective = (
        True, True, 1234, True)
    c = ddp_config(cfg)
    assert (c.grad_reduce_in_fp32, c.overlap_grad_reduce, c.overlap_param_gather, c.use_distributed_optimizer,
            c.check_for_nan_in_grad, c.bucket_size, c.average_in_collective) == (True, True, True, True, True, 1234,
                                                                                  True)
    default = ddp_config(tiny_llama_pretrain_config())
    assert not default.overlap_grad_reduce and not default.use_distributed_optimizer and default.bucket_size is None


def test_optimizer_options_map_to_megatron_core_optimizer_config() -> None:
    cfg = tiny_llama_pretrain_config()
    o = cfg.optimizer
    c = optimizer_config(cfg)
    assert (c.optimizer, c.lr, c.min_lr, c.weight_decay) == ("adam", o.lr, o.min_lr, o.weight_decay)
    assert (c.adam_beta1, c.adam_beta2, c.adam_eps, c.clip_grad) == (o.adam_beta1, o.adam_beta2, o.adam_eps,
                                                                      o.clip_grad)
    assert not c.use_distributed_optimizer and not c.bf16 and not c.fp16 and c.params_dtype == torch.float32
    cfg.optimizer.use_distributed_optimizer = True
    assert optimizer_config(cfg).use_distributed_optimizer


def test_cpu_device_is_a_named_error() -> None:
    with pytest.raises(MegatronCoreNeedsCudaError, match="model.engine='native'"):
        require_cuda(CPU)


def _mcore_cfg(**model: object):  # noqa: ANN202
    cfg = tiny_llama_pretrain_config()
    cfg.model.engine = "megatron_core"
    for k, v in model.items():
        setattr(cfg.model, k, v)
    return cfg


def test_initialize_keeps_the_same_layout_and_refuses_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """megatron-core's groups need one process per rank, so its state (4 ranks: TP 2, PP 2, VP 2) is simulated here
    through its own getters; the comparison and the refusal are the library's."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from megatron_bridge.engines.megatron_core import parallel_state
    from megatron_bridge.errors import MegatronBridgeError

    assert parallel_state.current_layout() is None  # nothing initialized in this process
    cfg = _mcore_cfg(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                     virtual_pipeline_model_parallel_size=2)
    assert parallel_state.layout(cfg) == (2, 2, 1, 2, 1, 2)  # ETP None: TP
    for getter, size in (("model_parallel_is_initialized", True), ("get_tensor_model_parallel_world_size", 2),
                         ("get_pipeline_model_parallel_world_size", 2), ("get_context_parallel_world_size", 1),
                         ("get_virtual_pipeline_model_parallel_world_size", 2),
                         ("get_expert_model_parallel_world_size", 1), ("get_expert_tensor_parallel_world_size", 2)):
        monkeypatch.setattr(ps, getter, lambda size=size: size)
    monkeypatch.setattr(ps, "initialize_model_parallel", lambda **kw: pytest.fail(f"re-initialized: {kw}"))
    seeds: list[int] = []
    monkeypatch.setattr(tensor_parallel, "model_parallel_cuda_manual_seed", seeds.append)
    assert parallel_state.current_layout() == (2, 2, 1, 2, 1, 2)
    parallel_state.initialize(cfg, torch.device("cuda", 0), seed=7)  # the same layout: kept, only seeded
    assert seeds == [7]
    cfg.model.virtual_pipeline_model_parallel_size = None
    refused = r"\(TP, PP, CP, VP, EP, ETP\) = \(2, 2, 1, 2, 1, 2\).*asks for \(2, 2, 1, None, 1, 2\).*destroy\(\)"
    with pytest.raises(MegatronBridgeError, match=refused):
        parallel_state.initialize(cfg, torch.device("cuda", 0), seed=7)


def test_unsupported_features_are_named_together() -> None:
    cfg = _mcore_cfg(pipeline_model_parallel_size=2, cpu_offloading=True, cpu_offloading_num_layers=1)
    cfg.checkpoint.save, cfg.checkpoint.ckpt_format = "/tmp/x", "torch"
    with pytest.raises(ConfigValidationError, match=r"\[rule megatron_core_features\]") as info:
        cfg.validate(world_size=2)
    for path in ("model.pipeline_model_parallel_size", "model.cpu_offloading", "checkpoint.ckpt_format"):
        assert path in str(info.value) and path in info.value.paths
    assert "model.engine='native'" in str(info.value)


def test_moe_fields_map_to_transformer_config() -> None:
    """An MoE model reaches megatron-core's MoELayer with every routing and loss field, the router in fp32, and
    sequential experts / an unfused permutation on the local spec (grouped GEMM and permute fusion need packages the
    local spec does not have); EP and ETP validate and reach its parallel state (they fold as megatron-core folds)."""
    from megatron_bridge.engines.megatron_core import parallel_state

    cfg = _mcore_cfg(num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=48, moe_aux_loss_coeff=1e-2,
                     moe_z_loss_coeff=1e-3, moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
                     moe_router_topk_scaling_factor=2.5, moe_shared_expert_intermediate_size=32,
                     moe_layer_freq=[0, 1, 1, 1], moe_grouped_gemm=True, moe_permute_fusion=True,
                     expert_model_parallel_size=2, expert_tensor_parallel_size=1)
    cfg.validate(world_size=2)
    tc = transformer_config(cfg.model, CPU)
    assert (tc.num_moe_experts, tc.moe_router_topk, tc.moe_ffn_hidden_size) == (4, 2, 48)
    assert (tc.moe_aux_loss_coeff, tc.moe_z_loss_coeff, tc.moe_router_score_function) == (1e-2, 1e-3, "sigmoid")
    assert tc.moe_router_enable_expert_bias and tc.moe_router_topk_scaling_factor == 2.5
    assert tc.moe_shared_expert_intermediate_size == 32 and tc.moe_layer_freq == [0, 1, 1, 1]
    assert tc.moe_router_dtype == "fp32" and not tc.moe_grouped_gemm and not tc.moe_permute_fusion
    assert (tc.expert_model_parallel_size, tc.expert_tensor_parallel_size) == (2, 1)
    assert parallel_state.layout(cfg)[4:] == (2, 1)
    spec = layer_spec(cfg.model, tc, pp_rank=0)
    moe = ["MoELayer" in repr(s.submodules.mlp) for s in spec.layer_specs]
    assert moe == [False, True, True, True], [repr(s.submodules.mlp)[:80] for s in spec.layer_specs]
    dense = _mcore_cfg().model
    assert transformer_config(dense, CPU).num_moe_experts is None


def test_moe_with_tensor_parallelism_needs_sequence_parallelism_on_megatron_core() -> None:
    """megatron-core's MoELayer raises at build time for TP > 1 without sequence parallelism ("performance may
    degrade ..."): validate() refuses it first, naming model.sequence_parallel (with SP, the local spec's Apex rule
    applies)."""
    cfg = _mcore_cfg(num_moe_experts=4, tensor_model_parallel_size=2, expert_model_parallel_size=2,
                     expert_tensor_parallel_size=1)
    with pytest.raises(ConfigValidationError, match=r"model.sequence_parallel=False.*\[rule megatron_core_features\]"):
        cfg.validate(world_size=2)
    cfg.model.sequence_parallel = True
    with pytest.raises(ConfigValidationError, match=r"\[rule megatron_core_sequence_parallel\]"):
        cfg.validate(world_size=2)  # no Apex here: the local spec's torch norms refuse SP


def test_transformer_engine_spec_without_transformer_engine() -> None:
    cfg = _mcore_cfg(transformer_impl="transformer_engine")
    with pytest.raises(ConfigValidationError, match=r"\[rule transformer_impl_available\]") as info:
        cfg.validate(world_size=1)
    assert "transformer-engine" in str(info.value) and "model.transformer_impl='local'" in str(info.value)


def test_tensor_parallel_needs_no_fsdp2_on_megatron_core() -> None:
    _mcore_cfg(tensor_model_parallel_size=2).validate(world_size=2)
    native = tiny_llama_pretrain_config()
    native.model.tensor_model_parallel_size = 2
    native.validate(world_size=2)  # the DDP backend applies TP too (distributed/ddp.py)


BROKEN_TE = """
import sys
sys.path.insert(0, {fake!r})
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.recipes import tiny_llama_pretrain_config
native = tiny_llama_pretrain_config()
native.validate(world_size=1)
cfg = tiny_llama_pretrain_config()
cfg.model.engine = "megatron_core"
cfg.model.transformer_impl = "transformer_engine"
try:
    cfg.validate(world_size=1)
except ConfigValidationError as exc:
    print("ERROR", exc)
"""


def test_present_but_broken_transformer_engine_is_a_named_error(tmp_path: Path) -> None:
    """A transformer-engine that raises RuntimeError at import (as on a machine without CUDA) does not break the
    native engine's validation, and the TE spec gets a named error with the reason."""
    fake = tmp_path / "fake"
    (fake / "transformer_engine").mkdir(parents=True)
    (fake / "transformer_engine" / "__init__.py").write_text(
        "raise RuntimeError('cudnn shared object not found')\n")
    code = textwrap.dedent(BROKEN_TE.format(fake=str(fake)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ERROR" in out.stdout and "[rule transformer_impl_available]" in out.stdout, out.stdout
    assert "RuntimeError: cudnn shared object not found" in out.stdout


def test_native_engine_never_imports_megatron_core() -> None:
    code = ("import sys\nfrom megatron_bridge.recipes import tiny_llama_pretrain_config as f\n"
            "f().validate(world_size=1)\n"
            "import megatron_bridge.training.pretrain, megatron_bridge.engines.ddp_wrap\n"
            "print([m for m in sys.modules if m.split('.')[0] == 'megatron'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout


def test_no_cuda_graphs_and_no_deprecation_warning() -> None:
    import warnings

    m = tiny_llama_pretrain_config().model
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tc = transformer_config(m, CPU)
    assert tc.cuda_graph_impl == "none" and tc.cuda_graph_modules == []  # the whole layer, as "full" meant
    assert not [w for w in caught if "cuda_graph" in str(w.message) or "scope is deprecated" in str(w.message)]


def test_window_fields_reach_transformer_config() -> None:
    m = tiny_llama_pretrain_config().model
    m.window_size, m.window_attn_skip_freq = (31, 0), 2
    tc = transformer_config(m, CPU)
    assert tc.window_size == (31, 0) and tc.window_attn_skip_freq == 2
    assert transformer_config(tiny_llama_pretrain_config().model, CPU).window_size is None


NOT_MODEL_ARCHITECTURE = {
    "family": "names the family (export, perf configs); the provider builds the same GPTModel from the other fields",
    "max_position_embeddings": "only recorded and exported (training uses seq_length on both engines)",
}
"""ModelConfig fields that do not change what the model computes, with the reason."""
REFUSED_WITH = {
    "recompute_method": "recompute_granularity", "recompute_num_layers": "recompute_granularity",
    "cpu_offloading_num_layers": "cpu_offloading", "cpu_offloading_activations": "cpu_offloading",
    "cpu_offloading_weights": "cpu_offloading", "moe_router_group_topk": "moe_router_num_groups",
    "mtp_loss_scaling_factor": "mtp_num_layers",
    **{name: "multi_latent_attention" for name in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                                                   "v_head_dim")},
    **{f"yarn_{name}": "position_embedding_type" for name in (
        "rotary_scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
        "mscale_all_dim", "correction_range_round_to_int")},
}
"""Fields that act only together with another field megatron-core refuses (every moe_* field: num_moe_experts)."""


def _fields_read_by(source: str, model_fields: set[str]) -> set[str]:
    """Fields ``source`` reads as ``model.<field>``, directly or through a ModelConfig property or method."""
    import inspect
    import re

    from megatron_bridge.config.model import ModelConfig

    derived = {name: set(re.findall(r"self\.(\w+)", inspect.getsource(getattr(ModelConfig, name).fget
                                                                     if isinstance(getattr(ModelConfig, name), property)
                                                                     else getattr(ModelConfig, name))))
               for name, value in vars(ModelConfig).items() if isinstance(value, property) or (
                   callable(value) and not name.startswith("_"))}
    read = set(re.findall(r"\bmodel\.(\w+)", source))
    out = read & model_fields
    for name in read & set(derived):
        out |= derived[name] & model_fields
    return out


def test_every_model_field_is_mapped_to_megatron_core_or_refused_there() -> None:
    """A ModelConfig field either reaches megatron-core (engines/megatron_core/provider.py reads it, directly or
    through a ModelConfig property), is checked by a megatron-core rule (config/rules_engine.py names it: refused or
    limited), acts only with a refused field, or is named above as not changing the model. A new field that is none of
    these fails here: it would be silently ignored on that engine."""
    import dataclasses
    import inspect

    from megatron_bridge.config import rules_engine
    from megatron_bridge.config.model import ModelConfig
    from megatron_bridge.engines.megatron_core import provider

    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    mapped = _fields_read_by(inspect.getsource(provider), fields) | set(provider._MOE_FIELDS)
    rule_source = inspect.getsource(rules_engine)
    checked = {f for f in fields if f"model.{f}" in rule_source or f"m.{f}" in rule_source}
    refused_moe = {f for f in fields if f.startswith("moe_") or f == "num_moe_experts"} if "model.num_moe_experts" in \
        inspect.getsource(rules_engine._unsupported) else set()
    dependent = {f for f, parent in REFUSED_WITH.items() if parent in checked}
    missing = sorted(fields - mapped - checked - refused_moe - dependent - set(NOT_MODEL_ARCHITECTURE))
    assert not missing, (f"ModelConfig fields neither mapped to megatron-core (provider.py) nor refused there "
                         f"(rules_engine.py): {missing}")
    assert {"window_size", "window_attn_skip_freq", "num_query_groups", "kv_channels", "vocab_size"} <= mapped
