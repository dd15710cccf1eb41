"""FP8 on the local engine through torchao: which Linear layers convert, the preset → torchao recipe mapping, and
the conversion itself on CPU (torchao's emulation; the FP8 casts are real)."""

import pytest
import torch
from torch import nn
from torchao.float8.float8_linear import Float8Linear

from megatron_bridge.config.fp8_local import FP8_BLOCK_SIZE, MIN_CAPABILITY, NOT_ON_LOCAL_ENGINE, TORCHAO_RECIPES
from megatron_bridge.config.mixed_precision import FP8_RECIPES, get_mixed_precision_preset
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.models.float8 import (
    bf16_layer_indices,
    convert_chunk,
    float8_linear_config,
    fp8_module_filter,
)
from megatron_bridge.models.llama import LlamaModel


PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj")


def _model(**fields: object) -> LlamaModel:
    base = {"num_layers": 4, "hidden_size": 64, "ffn_hidden_size": 176, "num_attention_heads": 4,
            "num_query_groups": 2, "vocab_size": 256, "seq_length": 32}
    torch.manual_seed(0)
    return LlamaModel(ModelConfig(**{**base, **fields}), device="cpu")


def _selected(model: nn.Module, preset: str, **changes: object) -> list[str]:
    mp = get_mixed_precision_preset(preset)
    for k, v in changes.items():
        setattr(mp, k, v)
    keep = fp8_module_filter(model, mp, model.config.num_layers)
    return [n for n, m in model.named_modules() if keep(m, n)]


def test_every_fp8_recipe_is_mapped_or_refused_with_a_reason() -> None:
    assert sorted([*TORCHAO_RECIPES, *NOT_ON_LOCAL_ENGINE]) == sorted([*FP8_RECIPES, "nvfp4"])
    assert set(TORCHAO_RECIPES) == set(MIN_CAPABILITY) == set(FP8_BLOCK_SIZE)
    assert MIN_CAPABILITY == {"tensorwise": (8, 9), "mxfp8": (10, 0)}


def test_current_scaling_preset_keeps_first_last_layer_and_output_layer_in_bf16() -> None:
    model = _model()
    assert _selected(model, "bf16_with_fp8_current_scaling_mixed") == [f"layers.{i}.{p}" for i in (1, 2)
                                                                       for p in PROJ]
    everything = _selected(model, "bf16_with_fp8_current_scaling_mixed", first_last_layers_bf16=False)
    assert everything == [f"layers.{i}.{p}" for i in range(4) for p in PROJ]
    assert "lm_head" not in everything and model.lm_head is not None


def test_dims_not_multiple_of_16_are_left_alone() -> None:
    model = _model(ffn_hidden_size=100)  # gate/up: 64 -> 100, down: 100 -> 64
    chosen = _selected(model, "bf16_with_fp8_current_scaling_mixed", first_last_layers_bf16=False)
    assert chosen == [f"layers.{i}.self_attn.{p}" for i in range(4) for p in ("q_proj", "k_proj", "v_proj", "o_proj")]


def test_mxfp8_needs_multiples_of_its_32_element_block() -> None:
    model = _model(ffn_hidden_size=176)  # 176 = 11 * 16: fine for tensorwise, not for MX blocks of 32
    chosen = _selected(model, "bf16_with_mxfp8_mixed")
    assert chosen == [f"layers.{i}.self_attn.{p}" for i in range(4) for p in ("q_proj", "k_proj", "v_proj", "o_proj")]


def test_bf16_layer_indices() -> None:
    mp = get_mixed_precision_preset("bf16_with_fp8_current_scaling_mixed")
    assert bf16_layer_indices(mp, 6) == {0, 5}
    mp.num_layers_at_start_in_bf16, mp.num_layers_at_end_in_bf16 = 2, 0
    assert bf16_layer_indices(mp, 6) == {0, 1}
    mp.first_last_layers_bf16 = False
    assert bf16_layer_indices(mp, 6) == set()


@pytest.mark.parametrize(("fp8", "grad_dtype"), [("hybrid", torch.float8_e5m2), ("e4m3", torch.float8_e4m3fn)])
def test_float8_linear_config_formats(fp8: str, grad_dtype: torch.dtype) -> None:
    mp = get_mixed_precision_preset("bf16_with_fp8_current_scaling_mixed")
    mp.fp8 = fp8
    config = float8_linear_config(mp, fsdp_float8_all_gather=True)
    assert config.cast_config_input.target_dtype == torch.float8_e4m3fn
    assert config.cast_config_weight.target_dtype == torch.float8_e4m3fn
    assert config.cast_config_grad_output.target_dtype == grad_dtype
    assert config.enable_fsdp_float8_all_gather and not config.emulate


def test_tensorwise_conversion_runs_on_cpu_and_keeps_checkpoint_keys() -> None:
    model = _model()
    keys = list(model.state_dict())
    mp = get_mixed_precision_preset("bf16_with_fp8_current_scaling_mixed")
    names = convert_chunk(model, mp, 4, fsdp_float8_all_gather=False, emulate=True)
    assert [n for n, m in model.named_modules() if isinstance(m, Float8Linear)] == names
    assert len(names) == 14 and list(model.state_dict()) == keys
    tokens = torch.randint(0, 256, (2, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens)
    logits.float().logsumexp(-1).mean().backward()
    grads = [model.get_submodule(n).weight.grad for n in names]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


def test_mxfp8_conversion_swaps_the_selected_weights() -> None:
    from torchao.prototype.moe_training.tensor import MXFP8TrainingWeightWrapperTensor

    model = _model(ffn_hidden_size=192)
    mp = get_mixed_precision_preset("bf16_with_mxfp8_mixed")
    names = convert_chunk(model, mp, 4, fsdp_float8_all_gather=False, emulate=True)
    assert len(names) == 28
    wrapped = [n for n, m in model.named_modules()
               if isinstance(getattr(m, "weight", None), MXFP8TrainingWeightWrapperTensor)]
    assert wrapped == names


def test_refused_recipe_is_a_named_error() -> None:
    from megatron_bridge.errors import ConfigValidationError
    from megatron_bridge.models.float8 import convert_for_fp8_training
    from megatron_bridge.recipes import tiny_llama_pretrain_config

    cfg = tiny_llama_pretrain_config()
    cfg.mixed_precision = get_mixed_precision_preset("bf16_with_fp8_delayed_scaling_mixed")
    with pytest.raises(ConfigValidationError, match=r"an FP8 recipe torchao trains with.*\[rule fp8_requirements\]"):
        convert_for_fp8_training([_model()], cfg)  # the rule of validate(), enforced at conversion
    with pytest.raises(ValueError, match="has no torchao training recipe"):
        convert_chunk(_model(), cfg.mixed_precision, 4, fsdp_float8_all_gather=False)


def test_meta_device_model_converted_then_initialized_equals_direct_build() -> None:
    """FSDP2 with model.init_model_with_meta_device converts before init_weights: Float8Linear keeps the
    output-projection marker, so o_proj/down_proj get Megatron's scaled init as in a direct build."""
    from megatron_bridge.models.provider import materialize_meta_model

    mp = get_mixed_precision_preset("bf16_with_fp8_current_scaling_mixed")
    direct = _model()
    convert_chunk(direct, mp, 4, fsdp_float8_all_gather=True, emulate=True)
    torch.manual_seed(0)
    meta = LlamaModel(direct.config, device="meta")
    convert_chunk(meta, mp, 4, fsdp_float8_all_gather=True, emulate=True)
    materialize_meta_model(meta, torch.device("cpu"))
    for (name, a), (_, b) in zip(direct.state_dict().items(), meta.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
