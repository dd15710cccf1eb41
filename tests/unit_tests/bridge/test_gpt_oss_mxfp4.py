"""GPT-OSS's MXFP4 checkpoints (``families/gpt_oss/mxfp4.py``): a tiny GPT-OSS folder rewritten as the published
weights are stored (the experts' ``gate_up_proj`` and ``down_proj`` as uint8 ``*_blocks``, two FP4 codes per byte, and
``*_scales``, one e8m0 exponent per 32 values; everything else unquantized) from known weights that MXFP4 represents
exactly: the import gives exactly those weights (and transformers' own decoder, ``convert_moe_packed_tensors``, gives
them too), transformers' logits for them (fp32, 1e-5), and exports them unquantized without ``quantization_config``.
Malformed folders are named errors."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from megatron_bridge import AutoBridge
from megatron_bridge.errors import BridgeError
from megatron_bridge.families.gpt_oss.mxfp4 import FP4_VALUES, dequantize
from tests.unit_tests.bridge.hf_models import VOCAB, hf_logits, hf_model, our_logits


QUANT = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                             "model.embed_tokens", "lm_head"]}
TOKENS = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0))
PACKED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def _encode(shape: tuple[int, ...], gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random weights ``[E, in, out]`` that MXFP4 holds exactly, with their blocks ``[E, out, in/32, 16]`` and scales
    ``[E, out, in/32]`` written as the published checkpoints store them (low nibble = even position)."""
    experts, inner, outer = shape
    codes = torch.randint(0, 16, (experts, outer, inner), generator=gen, dtype=torch.uint8)
    scales = torch.randint(127 - 3, 127 + 6, (experts, outer, inner // 32), generator=gen, dtype=torch.uint8)
    values = torch.tensor(FP4_VALUES)[codes.long()] * torch.exp2(scales.float() - 127).repeat_interleave(32, -1)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).reshape(experts, outer, inner // 32, 16)
    return values.transpose(1, 2).contiguous(), blocks, scales


def _mxfp4_folder(folder):  # noqa: ANN001, ANN202
    """The tiny GPT-OSS with MXFP4-exact experts: ``folder/plain`` unquantized, ``folder/mxfp4`` packed. Returns
    transformers' model of the plain folder, the known expert weights by HF name, and the packed tensors."""
    from transformers import AutoModelForCausalLM

    hf_model("gpt-oss").save_pretrained(folder / "plain")
    tensors = load_file(str(folder / "plain" / "model.safetensors"))
    gen = torch.Generator().manual_seed(1)
    plain, packed, known = {}, {}, {}
    for name, tensor in tensors.items():
        if name.endswith(PACKED):
            known[name], packed[name + "_blocks"], packed[name + "_scales"] = _encode(tuple(tensor.shape), gen)
            plain[name] = known[name]
        else:
            plain[name] = packed[name] = tensor
    config = json.loads((folder / "plain" / "config.json").read_text())
    save_file(plain, str(folder / "plain" / "model.safetensors"), metadata={"format": "pt"})
    (folder / "mxfp4").mkdir()
    save_file(packed, str(folder / "mxfp4" / "model.safetensors"), metadata={"format": "pt"})
    (folder / "mxfp4" / "config.json").write_text(json.dumps({**config, "quantization_config": QUANT}))
    model = AutoModelForCausalLM.from_pretrained(folder / "plain", dtype=torch.float32).eval()
    return model, known, packed


def test_mxfp4_folder_imports_the_exact_weights_and_exports_unquantized(tmp_path) -> None:  # noqa: ANN001
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    model, known, packed = _mxfp4_folder(tmp_path)
    assert len(known) == 4  # two layers, gate_up and down each
    for name, weight in known.items():  # the test's encoding is the published layout, by transformers' decoder
        reference = convert_moe_packed_tensors(packed[name + "_blocks"], packed[name + "_scales"], dtype=torch.float32)
        assert torch.equal(reference, weight)
    bridge = AutoBridge.from_hf_pretrained(tmp_path / "mxfp4")
    ours = bridge.to_megatron_model(wrap_with_ddp=False)[0]
    params = dict(ours.named_parameters())
    for name, weight in known.items():
        experts = name.removeprefix("model.").rsplit(".", 1)[0]
        if name.endswith("gate_up_proj"):
            assert torch.equal(params[f"{experts}.gate_proj"], weight[..., 0::2])
            assert torch.equal(params[f"{experts}.up_proj"], weight[..., 1::2])
        else:
            assert torch.equal(params[f"{experts}.down_proj"], weight)
    assert (our_logits(ours, TOKENS) - hf_logits(model, TOKENS)).abs().max() <= 1e-5
    bridge.save_hf_pretrained([ours], tmp_path / "out")
    exported = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert not any(name.endswith(("_blocks", "_scales")) for name in exported)
    assert all(torch.equal(exported[name], weight) for name, weight in known.items())
    assert "quantization_config" not in json.loads((tmp_path / "out" / "config.json").read_text())


def _rewrite(folder, change) -> None:  # noqa: ANN001
    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


_SCALES = "model.layers.0.mlp.experts.down_proj_scales"
_BLOCKS = "model.layers.0.mlp.experts.down_proj_blocks"


@pytest.mark.parametrize(("change", "match"), [
    (lambda t: t.pop(_SCALES), "has no 'model.layers.0.mlp.experts.down_proj_scales'"),
    (lambda t: t.pop(_BLOCKS), "have no 'model.layers.0.mlp.experts.down_proj_blocks'"),
    (lambda t: t.update({_SCALES: t[_SCALES][:, :, :1].contiguous()}), r"blocks \[4, 32, 2, 16\] and scales"),
    (lambda t: t.update({_BLOCKS: t[_BLOCKS][..., :8].contiguous()}), "must be"),
    (lambda t: t.update({_BLOCKS: t[_BLOCKS][:, :16].contiguous(), _SCALES: t[_SCALES][:, :16].contiguous()}),
     "down_proj' has shape"),
    (lambda t: t.update({_SCALES: t[_SCALES].float()}), "must be uint8"),
], ids=["missing-scales", "missing-blocks", "scales-shape", "block-bytes", "rows", "scales-dtype"])
def test_malformed_mxfp4_folders_are_named_errors(tmp_path, change, match) -> None:  # noqa: ANN001
    _mxfp4_folder(tmp_path)
    _rewrite(tmp_path / "mxfp4", change)
    with pytest.raises(BridgeError, match=match):
        AutoBridge.from_hf_pretrained(tmp_path / "mxfp4").to_megatron_model(wrap_with_ddp=False)


def test_packed_tensors_need_the_mxfp4_config_and_other_methods_are_refused(tmp_path) -> None:  # noqa: ANN001
    _mxfp4_folder(tmp_path)
    path = tmp_path / "mxfp4" / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in config.items() if k != "quantization_config"}))
    with pytest.raises(BridgeError, match="has no quantization_config"):
        AutoBridge.from_hf_pretrained(tmp_path / "mxfp4").to_megatron_model(wrap_with_ddp=False)
    path.write_text(json.dumps({**config, "quantization_config": {"quant_method": "fp8"}}))
    with pytest.raises(BridgeError, match="quant_method='fp8'"):
        AutoBridge.from_hf_pretrained(tmp_path / "mxfp4")


def test_nibble_order_and_scale_bias() -> None:
    """Byte 0x21 of a block is values (0.5, 1.0): the low nibble first; scale 128 doubles them; a block of 32 values
    along the input dimension lands in column ``out`` of ``[E, in, out]``."""
    blocks = torch.zeros(1, 2, 1, 16, dtype=torch.uint8)
    blocks[0, 1, 0, 0] = 0x21
    blocks[0, 1, 0, 15] = 0xF9  # -0.5 then -6.0
    scales = torch.tensor([[[127], [128]]], dtype=torch.uint8)
    out = dequantize("x", blocks, scales)
    assert out.shape == (1, 32, 2)
    assert out[0, :, 0].abs().sum() == 0
    assert out[0, :4, 1].tolist() == [1.0, 2.0, 0.0, 0.0]
    assert out[0, 30:, 1].tolist() == [-1.0, -12.0]


def test_every_byte_and_a_range_of_scales_decode_as_transformers_does() -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    gen = torch.Generator().manual_seed(3)
    blocks = torch.randint(0, 256, (3, 40, 4, 16), generator=gen, dtype=torch.uint8)
    blocks.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)
    scales = torch.randint(100, 150, (3, 40, 4), generator=gen, dtype=torch.uint8)
    reference = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    assert torch.equal(dequantize("x", blocks, scales), reference)
