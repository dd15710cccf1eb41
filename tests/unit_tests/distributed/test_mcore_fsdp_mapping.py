"""``ddp_wrap`` for megatron-core chunks: which backend the config selects, how ``cfg.ddp`` / ``cfg.fsdp2`` map to
megatron-core's Megatron FSDP and FSDP2 wrapper configs, and the refusals of rule ``megatron_core_fsdp`` (field, value,
fix). Nothing here wraps a model (that needs the functional tests' harness: tests/functional_tests/mcore/
test_wrappers.py)."""

import pytest
import torch

from megatron_bridge.errors import ConfigValidationError, MegatronBridgeError
from megatron_bridge.recipes import tiny_llama_pretrain_config


pytest.importorskip("megatron.core", reason="the megatron-core engine needs megatron-core (Python 3.12 environment)")

from megatron_bridge.engines.ddp_wrap import select_backend_class  # noqa: E402
from megatron_bridge.engines.megatron_core.ddp import MegatronCoreDDPBackend  # noqa: E402
from megatron_bridge.engines.megatron_core.fsdp2 import (  # noqa: E402
    MegatronCoreFSDP2Backend,
    torch_fsdp2_ddp_config,
    units_to_wrap,
)
from megatron_bridge.engines.megatron_core.megatron_fsdp import (  # noqa: E402
    MegatronCoreFSDPBackend,
    megatron_fsdp_ddp_config,
    unit_module_classes,
)


def _mcore(**dotted: object):  # noqa: ANN202
    cfg = tiny_llama_pretrain_config()
    cfg.model.engine = "megatron_core"
    for path, value in dotted.items():
        *section, field = path.split("__")
        setattr(getattr(cfg, section[0]) if section else cfg, field, value)
    return cfg


@pytest.mark.parametrize(("flags", "backend"), [
    ({}, MegatronCoreDDPBackend),
    ({"dist__use_megatron_fsdp": True}, MegatronCoreFSDPBackend),
    ({"dist__use_torch_fsdp2": True}, MegatronCoreFSDP2Backend),
])
def test_factory_selects_the_megatron_core_wrapper(flags: dict, backend: type) -> None:
    assert select_backend_class(_mcore(**flags)) is backend


def test_megatron_fsdp_options_map_to_the_adapter_config() -> None:
    cfg = _mcore(dist__use_megatron_fsdp=True)
    d = cfg.ddp
    d.data_parallel_sharding_strategy, d.overlap_grad_reduce, d.overlap_param_gather = "optim_grads", True, True
    d.use_distributed_optimizer, d.check_for_nan_in_grad, d.bucket_size = True, True, 4096
    d.grad_reduce_in_fp32, d.preserve_fp32_weights, d.fsdp_double_buffer, d.keep_fp8_transpose_cache = (
        True, True, True, True)
    c = megatron_fsdp_ddp_config(cfg)
    assert c.use_megatron_fsdp and c.data_parallel_sharding_strategy == "optim_grads"
    assert (c.overlap_grad_reduce, c.overlap_param_gather, c.use_distributed_optimizer, c.check_for_nan_in_grad) == (
        True, True, True, True)
    assert c.bucket_size == c.suggested_communication_unit_size == 4096
    assert c.grad_reduce_in_fp32 and c.megatron_fsdp_main_grads_dtype == torch.float32
    assert c.megatron_fsdp_main_params_dtype == torch.float32
    assert c.fsdp_double_buffer and c.keep_fp8_transpose_cache and not c.nccl_ub
    default = megatron_fsdp_ddp_config(_mcore(dist__use_megatron_fsdp=True))
    assert default.data_parallel_sharding_strategy == "no_shard" and default.bucket_size is None
    assert default.megatron_fsdp_main_grads_dtype is None and default.megatron_fsdp_main_params_dtype is None


def test_megatron_fsdp_bf16_mixed_keeps_fp32_main_weights() -> None:
    """Megatron-Bridge's bf16_mixed: bf16 compute (Float16Module), fp32 main weights and fp32 gradient reduction in
    megatron-fsdp (its megatron_fsdp_main_params_dtype defaults to float32 there)."""
    cfg = _mcore(dist__use_megatron_fsdp=True)
    cfg.mixed_precision = "bf16_mixed"
    cfg.validate(world_size=2)
    c = megatron_fsdp_ddp_config(cfg)
    assert c.megatron_fsdp_main_params_dtype == torch.float32
    assert c.grad_reduce_in_fp32 and c.megatron_fsdp_main_grads_dtype == torch.float32


@pytest.mark.parametrize(("flag", "preset", "refused"), [("dist__use_megatron_fsdp", "fp16_mixed", True),
                                                         ("dist__use_torch_fsdp2", "fp16_mixed", True),
                                                         ("dist__use_megatron_fsdp", "bf16_mixed", False)])
def test_fsdp_precision_presets(flag: str, preset: str, refused: bool) -> None:
    cfg = _mcore(**{flag: True})
    cfg.mixed_precision = preset
    if not refused:
        cfg.validate(world_size=2)
        return
    with pytest.raises(ConfigValidationError, match=r"\[rule megatron_core_fsdp\]") as info:
        cfg.validate(world_size=2)
    assert "mixed_precision" in info.value.paths and "mixed_precision='fp32'" in str(info.value) or (
        "'bf16_mixed' or 'fp32'" in str(info.value))


def test_megatron_fsdp_pipeline_refusal_cites_megatron_core() -> None:
    cfg = _mcore(dist__use_megatron_fsdp=True, model__pipeline_model_parallel_size=2)
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=4)
    assert "model.pipeline_model_parallel_size" in info.value.paths
    assert "_get_dp_tp_mesh" in str(info.value)


def test_megatron_fsdp_validate_turns_on_the_distributed_optimizer() -> None:
    cfg = _mcore(dist__use_megatron_fsdp=True)
    cfg.ddp.average_in_collective = True
    cfg.validate(world_size=2)
    assert cfg.ddp.use_megatron_fsdp and cfg.ddp.use_distributed_optimizer and cfg.optimizer.use_distributed_optimizer
    assert not cfg.ddp.average_in_collective


def test_unit_modules_from_class_paths() -> None:
    from megatron.core.transformer.transformer_layer import TransformerLayer

    class Block(torch.nn.Module):
        pass

    model = torch.nn.Sequential(TransformerLayer.__new__(TransformerLayer))
    torch.nn.Module.__init__(model[0])
    assert unit_module_classes(None, model) is None
    path = "megatron.core.transformer.transformer_layer.TransformerLayer"
    assert unit_module_classes([path], model) == [TransformerLayer]
    for bad, match in ((["no.such.Class"], "not an importable"),  # [] is rule megatron_fsdp_unit_modules
                       (["torch.nn.Linear"], "no submodule")):
        with pytest.raises(MegatronBridgeError, match=match):
            unit_module_classes(bad, model)


def test_fsdp2_options_map_to_torch_fsdp2_config() -> None:
    cfg = _mcore(dist__use_torch_fsdp2=True)
    assert torch_fsdp2_ddp_config(cfg).reshard_after_forward is True  # None: megatron-core's default
    cfg.fsdp2.reshard_after_forward = False
    cfg.ddp.grad_reduce_in_fp32 = True
    c = torch_fsdp2_ddp_config(cfg)
    assert c.reshard_after_forward is False and c.grad_reduce_in_fp32 and not c.use_distributed_optimizer


def test_fsdp2_units_follow_the_layer_spec() -> None:
    from megatron.core import tensor_parallel
    from megatron.core.transformer.transformer_layer import TransformerLayer

    local, te = units_to_wrap("local"), units_to_wrap("transformer_engine")
    assert TransformerLayer in local and tensor_parallel.ColumnParallelLinear not in local
    assert te == local | {tensor_parallel.ColumnParallelLinear}


@pytest.mark.parametrize(("flag", "setting", "path"), [
    ("dist__use_torch_fsdp2", {"optimizer__use_distributed_optimizer": True}, "optimizer.use_distributed_optimizer"),
    ("dist__use_torch_fsdp2", {"model__share_embeddings_and_output_weights": True},
     "model.share_embeddings_and_output_weights"),
    ("dist__use_torch_fsdp2", {"fsdp2__activation_checkpointing": True}, "fsdp2.activation_checkpointing"),
    ("dist__use_torch_fsdp2", {"fsdp2__enable_compile": True}, "fsdp2.enable_compile"),
    ("dist__use_torch_fsdp2", {"fsdp2__tp_plan": {"decoder.*": "colwise"}}, "fsdp2.tp_plan"),
    ("dist__use_megatron_fsdp", {"ddp__report_nan_in_param_grad": True}, "ddp.report_nan_in_param_grad"),
    ("dist__use_megatron_fsdp", {"ddp__calculate_per_token_loss": True}, "ddp.calculate_per_token_loss"),
    ("dist__use_megatron_fsdp", {"ddp__megatron_fsdp_mlp_activation_checkpointing": True},
     "ddp.megatron_fsdp_mlp_activation_checkpointing"),
    ("dist__use_torch_fsdp2", {"model__pipeline_model_parallel_size": 2}, "model.pipeline_model_parallel_size"),
    ("dist__use_torch_fsdp2", {"mixed_precision": "fp16_mixed"}, "mixed_precision"),
])
def test_fsdp_refusals_name_field_value_and_fix(flag: str, setting: dict, path: str) -> None:
    cfg = _mcore(**{flag: True}, **setting)
    world_size = cfg.model.pipeline_model_parallel_size
    with pytest.raises(ConfigValidationError, match=r"\[rule megatron_core_fsdp\]") as info:
        cfg.validate(world_size=world_size)
    message = str(info.value)
    assert path in info.value.paths and f"{path}=" in message and "set " in message
    assert "model.engine='native'" in message


def test_megatron_fsdp_and_fsdp2_pass_validation_with_tensor_parallelism() -> None:
    for flag in ("dist__use_megatron_fsdp", "dist__use_torch_fsdp2"):
        _mcore(**{flag: True}, model__tensor_model_parallel_size=2).validate(world_size=4)


def test_fsdp2_refusals_say_why() -> None:
    """Pipeline parallelism and fp16 stay refused with FSDP2 because Megatron-LM refuses them; the message says so."""
    for setting, reason in (({"model__pipeline_model_parallel_size": 2}, "refuses --use-torch-fsdp2 with pipeline"),
                            ({"mixed_precision": "fp16_mixed"}, "refuses --use-torch-fsdp2 with fp16")):
        cfg = _mcore(dist__use_torch_fsdp2=True, **setting)
        with pytest.raises(ConfigValidationError, match=reason):
            cfg.validate(world_size=cfg.model.pipeline_model_parallel_size)


@pytest.mark.parametrize("setting", [
    {"checkpoint__save": "/tmp/mb-never-written", "checkpoint__save_interval": 2},
    {"checkpoint__load": "/tmp/mb-never-written"},
    {"mixed_precision": "bf16_mixed"},
    {"checkpoint__pretrained_checkpoint": "/tmp/mb-never-written"},
    {"checkpoint__save": "/tmp/mb-never-written", "checkpoint__async_save": True},
    {"mixed_precision": "bf16_mixed", "checkpoint__save": "/tmp/mb-never-written", "checkpoint__async_save": True,
     "checkpoint__load": "/tmp/mb-never-written"},
    {"mixed_precision": "bf16_mixed", "checkpoint__pretrained_checkpoint": "/tmp/mb-never-written"},
])
def test_fsdp2_passes_validation_with_checkpoints_and_bf16(setting: dict) -> None:
    """FSDP2 on megatron-core: torch_dist checkpoints, sync or async (megatron-core's async save), in fp32 and
    bf16_mixed, and pretrained_checkpoint starts (tests/functional_tests/mcore/test_wrappers.py) pass every rule."""
    _mcore(dist__use_torch_fsdp2=True, **setting).validate(world_size=2)
