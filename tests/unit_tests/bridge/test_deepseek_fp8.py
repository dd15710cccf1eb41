"""DeepSeek-V3's fp8 checkpoints (``families/deepseek_v3/fp8.py``): a tiny DeepSeek-V3 folder rewritten as the
published weights are stored (every projection ``float8_e4m3fn`` with a ``weight_scale_inv`` per 8×8 block, ragged
blocks at the edges; norms, embeddings, routers and the output layer unquantized) imports with every weight equal to
``fp8 × its block scale``, gives transformers' logits for those dequantized weights (fp32, 1e-5) and exports them
unquantized without ``quantization_config``."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from megatron_bridge import AutoBridge
from megatron_bridge.errors import BridgeError
from megatron_bridge.families.deepseek_v3.fp8 import check_quantization_config, dequantize
from tests.unit_tests.bridge.hf_models import VOCAB, hf_logits, hf_model, our_logits


BLOCK = (8, 8)
QUANT = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(BLOCK)}
TOKENS = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0))


def _quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's block quantization: scale = block amax / 448, fp8 = weight / scale."""
    rows, cols = weight.shape
    scale = torch.empty(-(-rows // BLOCK[0]), -(-cols // BLOCK[1]))
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            block = weight[i * BLOCK[0]:(i + 1) * BLOCK[0], j * BLOCK[1]:(j + 1) * BLOCK[1]]
            scale[i, j] = block.abs().max() / 448.0
    spread = scale.repeat_interleave(BLOCK[0], 0).repeat_interleave(BLOCK[1], 1)[:rows, :cols]
    return (weight / spread).to(torch.float8_e4m3fn), scale


def _fp8_folder(folder):  # noqa: ANN001, ANN202
    """The tiny DeepSeek-V3 saved, then its projections quantized in place; returns transformers' model loaded from
    the same folder with the dequantized weights (``folder/dequantized``) and the dequantized tensors by name."""
    from transformers import AutoModelForCausalLM

    hf_model("deepseek-v3").save_pretrained(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    out, plain, dequantized = {}, {}, {}
    for name, tensor in tensors.items():
        if name.startswith("model.layers.") and name.endswith("_proj.weight") and tensor.dim() == 2:
            fp8, scale = _quantize(tensor)
            out[name], out[name + "_scale_inv"] = fp8, scale
            plain[name] = dequantized[name] = dequantize(fp8, scale, BLOCK)
        else:
            out[name] = plain[name] = tensor
    config = json.loads((folder / "config.json").read_text())
    (folder / "dequantized").mkdir()
    save_file(plain, str(folder / "dequantized" / "model.safetensors"), metadata={"format": "pt"})
    (folder / "dequantized" / "config.json").write_text(json.dumps(config))
    save_file(out, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": QUANT}))
    model = AutoModelForCausalLM.from_pretrained(folder / "dequantized", dtype=torch.float32).eval()
    return model, dequantized


def test_fp8_folder_imports_dequantized_and_exports_unquantized(tmp_path) -> None:  # noqa: ANN001
    model, dequantized = _fp8_folder(tmp_path / "fp8")
    bridge = AutoBridge.from_hf_pretrained(tmp_path / "fp8")
    ours = bridge.to_megatron_model(wrap_with_ddp=False)[0]
    assert (our_logits(ours, TOKENS) - hf_logits(model, TOKENS)).abs().max() <= 1e-5
    bridge.save_hf_pretrained([ours], tmp_path / "out")
    exported = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert not any(name.endswith("_scale_inv") for name in exported)
    assert all(torch.equal(exported[name], tensor) for name, tensor in dequantized.items())
    assert "quantization_config" not in json.loads((tmp_path / "out" / "config.json").read_text())


def test_block_scales_spread_over_ragged_blocks() -> None:
    weight = torch.full((10, 9), 2.0).to(torch.float8_e4m3fn)
    scale = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    out = dequantize(weight, scale, BLOCK)
    assert out[0, 0] == 2.0 and out[0, 8] == 4.0 and out[9, 0] == 6.0 and out[9, 8] == 8.0
    with pytest.raises(BridgeError, match="block scales"):
        dequantize(weight, scale[:1], BLOCK)


@pytest.mark.parametrize("quant", [{"quant_method": "bitsandbytes"}, {"quant_method": "fp8", "fmt": "e5m2",
                                                                      "weight_block_size": [128, 128]},
                                   {"quant_method": "fp8", "weight_block_size": [128]}])
def test_other_quantizations_are_refused_by_name(quant: dict) -> None:
    with pytest.raises(BridgeError, match="quantization_config"):
        check_quantization_config(quant)
