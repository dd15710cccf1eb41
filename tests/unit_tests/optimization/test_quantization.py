"""modelopt fake-quant on the local Llama, one process: each CPU format calibrates and changes the outputs, disabled
quantizers reproduce the unquantized model, the modelopt state round-trips through our checkpoint file format."""

import io

import pytest
import torch

from megatron_bridge.config.model_optimization import CPU_QUANT_FORMATS, QuantizationConfig
from megatron_bridge.models.llama import LlamaModel
from megatron_bridge.optimization.quantization import calibrate_and_quantize, disable_quantizers
from megatron_bridge.optimization.state import (
    is_quantized,
    is_quantizer_key,
    modelopt_state_bytes,
    restore_modelopt_state,
    without_quantizer_keys,
)
from tests.unit_tests.models.configs import tiny


pytest.importorskip("modelopt.torch.quantization")

CPU = torch.device("cpu")
EXACT_WHEN_DISABLED = ("int8", "fp8")
"""Formats that leave the weights untouched; SmoothQuant and AWQ fold a per-channel scale into the weights, so with
the quantizers disabled they match the unquantized model only up to float rounding (tolerance below)."""
FOLDED_ATOL = 1e-5


def _model() -> LlamaModel:
    torch.manual_seed(0)
    return LlamaModel(tiny(hidden_size=64, ffn_hidden_size=128), device=CPU)


def _batches() -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 100, (4, 16), generator=gen)
    return [{"tokens": tokens[:2], "position_ids": torch.arange(16).expand(2, 16)},
            {"tokens": tokens[2:], "position_ids": torch.arange(16).expand(2, 16)}]


@pytest.mark.parametrize("fmt", CPU_QUANT_FORMATS)
def test_cpu_format_quantizes_and_disables_exactly(fmt: str) -> None:
    ids = _batches()[0]["tokens"]
    reference = _model()(ids).detach()
    model = calibrate_and_quantize(_model(), QuantizationConfig(quant_cfg=fmt), _batches(), CPU)
    assert is_quantized(model)
    quantized = model(ids).detach()
    assert torch.isfinite(quantized).all()
    assert (quantized - reference).abs().max() > 1e-4, "fake-quant changed nothing"
    disable_quantizers(model)
    disabled = model(ids).detach()
    if fmt in EXACT_WHEN_DISABLED:
        assert torch.equal(disabled, reference)
    else:
        assert (disabled - reference).abs().max() <= FOLDED_ATOL


@pytest.mark.parametrize("fmt", ["int8_sq", "w4a8_awq"])
def test_modelopt_state_round_trips(fmt: str) -> None:
    model = calibrate_and_quantize(_model(), QuantizationConfig(quant_cfg=fmt), _batches(), CPU)
    content = torch.load(io.BytesIO(modelopt_state_bytes(model)), weights_only=True)
    assert content["quantizer_state"] and all(is_quantizer_key(k) for k in content["quantizer_state"])
    fresh = _model()
    fresh.load_state_dict(without_quantizer_keys(model.state_dict()))
    restored = restore_modelopt_state(fresh, content, "test")
    ids = _batches()[1]["tokens"]
    assert torch.equal(restored(ids), model(ids))


def test_weight_only_disables_input_quantizers() -> None:
    model = calibrate_and_quantize(_model(), QuantizationConfig(quant_cfg="int8", weight_only=True), _batches(), CPU)
    q_proj = model.layers[0].self_attn.q_proj
    assert not q_proj.input_quantizer.is_enabled and q_proj.weight_quantizer.is_enabled


def test_quantizer_keys() -> None:
    assert is_quantizer_key("layers.0.self_attn.q_proj.weight_quantizer._amax")
    assert is_quantizer_key("layers.0.mlp.up_proj.weight_quantizer.0._amax")
    assert not is_quantizer_key("layers.0.self_attn.q_proj.weight")
