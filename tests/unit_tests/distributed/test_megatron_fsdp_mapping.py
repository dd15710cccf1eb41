"""Megatron FSDP: cfg.ddp → megatron_fsdp.fully_shard_model arguments, checked against the installed package.

Runs on CPU: only the pure mapping, the signatures and the CUDA guard are exercised here (megatron-fsdp has no CPU
code path). A renamed or removed argument upstream makes ``test_every_kwarg_is_a_real_parameter`` fail.
"""

import dataclasses
import inspect
import logging
import sys

import megatron_fsdp
import pytest
import torch
from megatron_fsdp.fully_shard import ShardingStrategy
from torch import nn

from megatron_bridge.distributed import megatron_fsdp_compat as compat
from megatron_bridge.distributed.megatron_fsdp import (
    MegatronFSDPBackend,
    MetaInitReplay,
    activation_checkpointing_settings,
    materialize_meta_buffers,
    megatron_fsdp_kwargs,
)
from megatron_bridge.distributed.megatron_fsdp_compat import (
    KWARG_SOURCES,
    RUNTIME_KWARGS,
    SHARDING_STRATEGY_IDS,
    apply_communication_unit_size,
    resolve_unit_modules,
)
from megatron_bridge.engines.ddp_wrap import select_backend_class
from megatron_bridge.errors import ConfigValidationError, MegatronBridgeError
from megatron_bridge.models.llama import LlamaDecoderLayer, LlamaModel
from megatron_bridge.utils import logging as mb_logging
from tests.unit_tests.distributed.helpers import build, tiny_cfg


SIGNATURE = inspect.signature(megatron_fsdp.fully_shard_model).parameters
VERSION = compat.installed_version()
LEGACY_031_PARAMS = (  # megatron-fsdp 0.3.1's fully_shard_model (the one megatron-core 0.16.1 works with)
    "module", "device_mesh", "dp_shard_dim", "dp_outer_dim", "tp_dim", "hybrid_fsdp_group", "expt_device_mesh",
    "fsdp_unit_modules", "zero_dp_strategy", "outer_dp_sharding_strategy", "device", "init_model_with_meta_device",
    "grad_reduce_in_fp32", "preserve_fp32_weights", "overlap_grad_reduce", "overlap_param_gather",
    "sync_model_each_microbatch", "preproc_state_dict_for_dcp_ckpt", "check_for_nan_in_grad", "average_in_collective",
    "disable_bucketing", "calculate_per_token_loss", "keep_fp8_transpose_cache", "nccl_ub", "fsdp_double_buffer",
    "disable_symmetric_registration", "enable_fine_grained_param_gather",
)
BOOL_OPTIONS = ("overlap_grad_reduce", "overlap_param_gather", "average_in_collective", "disable_bucketing",
                "calculate_per_token_loss", "keep_fp8_transpose_cache", "nccl_ub", "fsdp_double_buffer",
                "report_nan_in_param_grad")


@pytest.fixture(autouse=True)
def _average_in_collective_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mapping tests pass average_in_collective through; its 0.6.1 crash check has its own test."""
    monkeypatch.setattr(compat, "average_in_collective_needs_experts", lambda mfsdp: False)


def mfsdp_cfg(**ddp: object):  # noqa: ANN201
    cfg = tiny_cfg()
    cfg.dist.use_megatron_fsdp = True
    cfg.ddp.use_megatron_fsdp = True
    cfg.ddp.data_parallel_sharding_strategy = "optim_grads_params"
    for key, value in ddp.items():
        setattr(cfg.ddp, key, value)
    return cfg


@pytest.fixture
def model() -> nn.Module:
    return build(tiny_cfg())[0]


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mb_logging, "_WARNED_ONCE", set())


# ------------------------------------------------------------------------------------- against the signature
def test_installed_version_is_the_tested_one() -> None:
    assert VERSION == compat.TESTED_VERSION == megatron_fsdp.__version__


def test_every_kwarg_is_a_real_parameter(model: nn.Module) -> None:
    cfg = mfsdp_cfg(**dict.fromkeys(BOOL_OPTIONS, True))
    cfg.model.init_model_with_meta_device = True
    kwargs = megatron_fsdp_kwargs(cfg, model)
    expected = {"fsdp_unit_modules", "dp_shard_dim", "tp_dim", "zero_dp_strategy", "init_model_with_meta_device",
                "sync_model_each_microbatch", "preproc_state_dict_for_dcp_ckpt", "mixed_precision_policy",
                *BOOL_OPTIONS}
    assert set(kwargs) == expected  # nothing dropped against the installed version
    for name in [*kwargs, *RUNTIME_KWARGS]:
        assert name in SIGNATURE, f"megatron_fsdp.fully_shard_model has no argument {name!r}"
    # the combined fully_shard(module, optimizer, ...) takes the same arguments
    assert set(kwargs) <= set(inspect.signature(megatron_fsdp.fully_shard).parameters)
    assert set(kwargs) <= set(KWARG_SOURCES)


def test_runtime_and_optimizer_api_exist() -> None:
    assert "preproc_state_dict_for_dcp_ckpt" in inspect.signature(megatron_fsdp.fully_shard_optimizer).parameters
    source = inspect.getsource(megatron_fsdp.fully_shard_optimizer)
    assert "sync_grad_before_optimizer_step" in source and "zero_grad_buffer" in source
    for method in ("finish_grad_sync", "_replace_param_with_distributed_if_needed", "zero_grad_buffer",
                   "install_optimized_model_weights", "no_sync"):
        assert callable(getattr(megatron_fsdp.MegatronFSDP, method)), method
    init_source = inspect.getsource(megatron_fsdp.MegatronFSDP)
    assert 'getattr(self, "is_last_microbatch", False)' in init_source
    assert "self.raw_param = " in init_source


@pytest.mark.parametrize("option", BOOL_OPTIONS)
def test_bool_options_pass_through(model: nn.Module, option: str) -> None:
    assert megatron_fsdp_kwargs(mfsdp_cfg(**{option: True}), model)[option] is True
    assert megatron_fsdp_kwargs(mfsdp_cfg(**{option: False}), model)[option] is False


def test_average_in_collective_is_adjusted(model: nn.Module, monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """megatron-fsdp 0.6.1 crashes with average_in_collective and no experts: the mapping makes validate()'s
    adjustment (logged) instead of failing, as Megatron-Bridge does."""
    monkeypatch.undo()
    assert compat.average_in_collective_needs_experts(megatron_fsdp)  # megatron-fsdp 0.6.1 crashes without experts
    cfg = mfsdp_cfg(average_in_collective=True)
    with caplog.at_level(logging.WARNING, logger="megatron_bridge"):
        assert megatron_fsdp_kwargs(cfg, model)["average_in_collective"] is False
    assert cfg.ddp.average_in_collective is False
    assert megatron_fsdp_kwargs(mfsdp_cfg(average_in_collective=False), model)["average_in_collective"] is False


def test_fixed_backend_arguments(model: nn.Module) -> None:
    kwargs = megatron_fsdp_kwargs(mfsdp_cfg(), model)
    assert kwargs["sync_model_each_microbatch"] is False
    assert kwargs["preproc_state_dict_for_dcp_ckpt"] is True
    assert (kwargs["dp_shard_dim"], kwargs["tp_dim"]) == ("dp_cp", "tp")  # shards over data × context ranks
    assert kwargs["init_model_with_meta_device"] is False
    assert "check_for_nan_in_grad" not in kwargs  # legacy: never passed


@pytest.mark.parametrize("strategy,expected", [("no_shard", 0), ("optim", 1), ("optim_grads", 2),
                                               ("optim_grads_params", 3)])
def test_sharding_strategies(model: nn.Module, strategy: str, expected: int) -> None:
    value = megatron_fsdp_kwargs(mfsdp_cfg(data_parallel_sharding_strategy=strategy), model)["zero_dp_strategy"]
    assert value == expected == SHARDING_STRATEGY_IDS[strategy]
    assert ShardingStrategy(value).name.lower() == strategy  # megatron-fsdp's own enum agrees


def test_unknown_strategy_is_named(model: nn.Module) -> None:
    with pytest.raises(MegatronBridgeError, match="ddp.data_parallel_sharding_strategy='zero3' is not one of"):
        megatron_fsdp_kwargs(mfsdp_cfg(data_parallel_sharding_strategy="zero3"), model)


@pytest.mark.parametrize("reduce_fp32,preserve_fp32", [(False, False), (True, False), (False, True), (True, True)])
def test_mixed_precision_policy(model: nn.Module, reduce_fp32: bool, preserve_fp32: bool) -> None:
    cfg = mfsdp_cfg(grad_reduce_in_fp32=reduce_fp32, preserve_fp32_weights=preserve_fp32)
    policy = megatron_fsdp_kwargs(cfg, model)["mixed_precision_policy"]
    assert isinstance(policy, megatron_fsdp.MixedPrecisionPolicy)
    assert policy.main_grads_dtype == (torch.float32 if reduce_fp32 else None)
    assert policy.main_params_dtype == (torch.float32 if preserve_fp32 else None)
    assert policy.grad_comm_dtype is None
    fields = {f.name for f in dataclasses.fields(megatron_fsdp.MixedPrecisionPolicy)}
    assert {"main_params_dtype", "main_grads_dtype", "grad_comm_dtype"} <= fields


def test_meta_device_option(model: nn.Module) -> None:
    cfg = mfsdp_cfg()
    cfg.model.init_model_with_meta_device = True
    assert megatron_fsdp_kwargs(cfg, model)["init_model_with_meta_device"] is True
    cfg.ddp.data_parallel_sharding_strategy = "no_shard"
    with pytest.raises(MegatronBridgeError, match="init_model_with_meta_device=True with .*'no_shard'"):
        megatron_fsdp_kwargs(cfg, model)


# ------------------------------------------------------------------------------------------------ unit modules
def test_unit_modules_default_from_no_split_modules(model: nn.Module) -> None:
    assert resolve_unit_modules(None, model) == [LlamaDecoderLayer]
    assert megatron_fsdp_kwargs(mfsdp_cfg(), model)["fsdp_unit_modules"] == [LlamaDecoderLayer]


def test_unit_modules_from_class_paths(model: nn.Module) -> None:
    paths = ["megatron_bridge.models.llama.LlamaDecoderLayer", "torch.nn.Embedding"]
    assert resolve_unit_modules(paths, model) == [LlamaDecoderLayer, nn.Embedding]


@pytest.mark.parametrize("paths,match", [
    ([], "names no FSDP unit"),
    (["megatron_bridge.models.llama.NoSuchBlock"], "cannot import"),
    (["no_such_package.Block"], "cannot import"),
    (["LlamaDecoderLayer"], "not a full class path"),
    (["megatron_bridge.models.llama.params_dtype_of"], "not a torch.nn.Module"),
    (["torch.nn.Conv2d"], "no submodule of LlamaModel is a torch.nn.Conv2d"),
])
def test_bad_unit_modules_are_named(model: nn.Module, paths: list[str], match: str) -> None:
    with pytest.raises(MegatronBridgeError, match=match) as info:
        megatron_fsdp_kwargs(mfsdp_cfg(megatron_fsdp_unit_modules=paths), model)
    assert "ddp.megatron_fsdp_unit_modules" in str(info.value)


@pytest.mark.parametrize("paths", [[], ["LlamaDecoderLayer"]])
def test_unit_modules_the_config_alone_refuses_are_one_rule(paths: list[str]) -> None:
    """``[]`` and a path without its module are refused by validate() (rule megatron_fsdp_unit_modules), the same
    rule both engines' Megatron FSDP wrappers enforce."""
    with pytest.raises(ConfigValidationError, match=r"\[rule megatron_fsdp_unit_modules\]") as info:
        mfsdp_cfg(megatron_fsdp_unit_modules=paths).validate(world_size=1)
    assert "ddp.megatron_fsdp_unit_modules" in info.value.paths


def test_model_without_no_split_modules() -> None:
    with pytest.raises(MegatronBridgeError, match="_no_split_modules"):
        resolve_unit_modules(None, nn.Sequential(nn.Linear(2, 2)))


# ---------------------------------------------------------------------------------- version differences
def test_unaccepted_option_names_option_version_and_fix(model: nn.Module) -> None:
    params = set(SIGNATURE) - {"nccl_ub"}
    with pytest.raises(MegatronBridgeError) as info:
        megatron_fsdp_kwargs(mfsdp_cfg(nccl_ub=True), model, params)
    message = str(info.value)
    assert "ddp.nccl_ub=True" in message and f"megatron-fsdp {VERSION}" in message
    assert f"pip install megatron-fsdp=={compat.TESTED_VERSION}" in message
    assert "nccl_ub" not in megatron_fsdp_kwargs(mfsdp_cfg(nccl_ub=False), model, params)  # off: left out


def test_missing_structural_argument_always_fails(model: nn.Module) -> None:
    params = set(SIGNATURE) - {"sync_model_each_microbatch"}
    with pytest.raises(MegatronBridgeError, match="'sync_model_each_microbatch'"):
        megatron_fsdp_kwargs(mfsdp_cfg(), model, params)


@pytest.mark.parametrize("params", [LEGACY_031_PARAMS, tuple(set(SIGNATURE) - {"mixed_precision_policy"})],
                         ids=["megatron-fsdp-0.3.1", "no-policy"])
def test_pre_policy_api_is_refused(model: nn.Module, params: tuple[str, ...]) -> None:
    with pytest.raises(MegatronBridgeError, match="predates MixedPrecisionPolicy") as info:
        megatron_fsdp_kwargs(mfsdp_cfg(), model, params)
    message = str(info.value)
    assert "ddp.grad_reduce_in_fp32" in message and f"pip install megatron-fsdp=={compat.TESTED_VERSION}" in message
    assert "megatron-core >= 0.19.0" in message


def test_ddp_config_mismatch_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    compat.check_ddp_config_compatible(megatron_fsdp.fully_shard_model)  # standalone config: fine

    @dataclasses.dataclass
    class OldCoreConfig:  # megatron-core 0.16.1's DistributedDataParallelConfig lacks this field
        overlap_grad_reduce: bool = False

    module = sys.modules["megatron_fsdp.fully_shard"]
    monkeypatch.setattr(module, "DistributedDataParallelConfig", OldCoreConfig)
    with pytest.raises(MegatronBridgeError, match="fsdp_db_use_persist_buf_on_alloc_fail") as info:
        compat.check_ddp_config_compatible(megatron_fsdp.fully_shard_model)
    assert "megatron-core 0.16.1 only works with megatron-fsdp 0.3.1" in str(info.value)


# ---------------------------------------------------------------------------------------- bucket size
def test_bucket_size_sets_the_communication_unit() -> None:
    source = inspect.getsource(megatron_fsdp.MegatronFSDP._init_fsdp_param_and_grad_buffer)
    assert "self.suggested_RS_queue_capacity = suggested_communication_unit_size" in source
    assert "self.suggested_AG_prefetch_size = suggested_communication_unit_size // 2" in source

    class Wrapped:
        ddp_config = megatron_fsdp.DistributedDataParallelConfig()
        suggested_RS_queue_capacity = 1
        suggested_AG_prefetch_size = 1

    wrapped = Wrapped()
    apply_communication_unit_size(wrapped, 40_000_000)
    assert (wrapped.suggested_RS_queue_capacity, wrapped.suggested_AG_prefetch_size) == (40_000_000, 20_000_000)
    assert wrapped.ddp_config.suggested_communication_unit_size == 40_000_000
    with pytest.raises(ConfigValidationError, match=r"ddp.bucket_size.*\[rule positive_sizes\]"):
        megatron_fsdp_kwargs(mfsdp_cfg(bucket_size=0), nn.Linear(2, 2))  # before the size reaches the wrapper
    with pytest.raises(MegatronBridgeError, match="ddp.bucket_size=8"):
        apply_communication_unit_size(object(), 8)


# -------------------------------------------------------------------------------------- CUDA guard, warning
def test_backend_is_selected_and_named() -> None:
    assert select_backend_class(mfsdp_cfg()) is MegatronFSDPBackend
    assert MegatronFSDPBackend.name == "megatron_fsdp"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_no_cuda_error(device: str, model: nn.Module) -> None:
    if torch.cuda.is_available():
        pytest.skip("the no-CUDA error needs a machine without CUDA")
    backend = MegatronFSDPBackend(mfsdp_cfg(), torch.device(device))
    with pytest.raises(MegatronBridgeError) as info:
        backend.wrap([model])
    message = str(info.value)
    assert "Megatron FSDP needs CUDA; megatron-fsdp has no CPU code path; use dist.use_torch_fsdp2 on CPU" in message
    assert backend.chunks == []


def test_legacy_nan_warning_once_even_without_validate(model: nn.Module, fresh_warnings: None,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    cfg = mfsdp_cfg(check_for_nan_in_grad=True)  # never validated
    with caplog.at_level(logging.WARNING, logger="megatron_bridge"):
        for _ in range(2):
            with pytest.raises(MegatronBridgeError):
                MegatronFSDPBackend(cfg, torch.device("cpu")).wrap([model])
        cfg.finalize()  # the config layer's adjustment: same key, no second warning
    warnings = [r for r in caplog.records if "check_for_nan_in_grad" in r.getMessage()]
    assert len(warnings) == 1 and "report_nan_in_param_grad" in warnings[0].getMessage()


# ------------------------------------------------------------------------------------ activation checkpointing
def test_activation_checkpointing_settings(fresh_warnings: None) -> None:
    assert activation_checkpointing_settings(mfsdp_cfg()) is None
    mlp = activation_checkpointing_settings(mfsdp_cfg(megatron_fsdp_mlp_activation_checkpointing=True))
    assert mlp is not None and mlp.mode == "full" and mlp.mlp_only
    cfg = mfsdp_cfg(megatron_fsdp_mlp_activation_checkpointing=True)
    cfg.model.recompute_granularity = "selective"
    blocks = activation_checkpointing_settings(cfg)
    assert blocks is not None and blocks.mode == "selective" and not blocks.mlp_only
    assert activation_checkpointing_settings(mfsdp_cfg(activation_checkpointing=True)) is None  # DDP-only option


# -------------------------------------------------------------------------------------------- meta-device init
def _materialize_like_megatron_fsdp(model: nn.Module, order: list[int] | None = None) -> None:
    """What megatron-fsdp does per module with meta parameters: to_empty(recurse=False) + reset_parameters()."""
    modules = [m for m in model.modules() if any(p.is_meta for p in m.parameters(recurse=False))]
    for i in order if order is not None else range(len(modules)):
        modules[i].to_empty(device="cpu", recurse=False)
        modules[i].reset_parameters()


@pytest.mark.parametrize("shuffled", [False, True])
def test_meta_init_replays_the_direct_build(shuffled: bool) -> None:
    cfg = tiny_cfg(num_layers=3)
    torch.manual_seed(1234)
    direct = LlamaModel(cfg.model, device="cpu")
    after_direct = torch.get_rng_state()

    torch.manual_seed(1234)
    model = LlamaModel(cfg.model, device="meta")
    replay = MetaInitReplay(model, torch.device("cpu"))
    n = sum(1 for m in model.modules() if any(p.is_meta for p in m.parameters(recurse=False)))
    order = list(reversed(range(n))) if shuffled else None  # out of order: replays from the start
    _materialize_like_megatron_fsdp(model, order)
    replay.finish()
    materialize_meta_buffers(model, torch.device("cpu"))

    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    expected = dict(direct.named_parameters())
    for name, param in model.named_parameters():
        assert torch.equal(param, expected[name]), name
    assert torch.equal(model.rotary_emb.inv_freq, direct.rotary_emb.inv_freq)
    assert torch.equal(torch.get_rng_state(), after_direct)  # later RNG consumers see the same stream
    tokens = torch.randint(0, 100, (2, 16))
    assert torch.equal(model(tokens, labels=tokens), direct(tokens, labels=tokens))


def test_meta_init_needs_reset_parameters() -> None:
    class Bare(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.empty(3, device="meta"))

    with pytest.raises(MegatronBridgeError, match="no reset_parameters"):
        MetaInitReplay(nn.Sequential(Bare()), torch.device("cpu"))


def test_async_save_is_refused(model: nn.Module) -> None:
    cfg = mfsdp_cfg()
    cfg.checkpoint.async_save = True
    with pytest.raises(MegatronBridgeError, match=r"checkpoint.async_save=True .*\[rule megatron_fsdp_async_save\]"):
        MegatronFSDPBackend(cfg, torch.device("cuda")).wrap([model])
