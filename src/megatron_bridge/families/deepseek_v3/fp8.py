"""DeepSeek-V3's fp8 checkpoints: block-scaled ``float8_e4m3fn`` weights dequantized on import.

The published weights (``quantization_config``: ``quant_method: fp8``, ``weight_block_size: [128, 128]``) store
each quantized linear weight ``W [out, in]`` as ``float8_e4m3fn`` with a ``weight_scale_inv`` tensor of
``[ceil(out / bo), ceil(in / bi)]`` float32 scales, one per ``bo × bi`` block (the last blocks ragged): ``W =
float(W_fp8) * scale_inv`` of its block, as DeepSeek's ``weight_dequant`` and Megatron-Bridge's
``dequantize_fp8_blockwise``. Norms, embeddings, the output layer and the routers are stored unquantized.
"""

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from megatron_bridge.errors import BridgeError


SCALE_SUFFIX = "_scale_inv"
"""``<name>.weight`` is scaled by ``<name>.weight_scale_inv``."""


def check_quantization_config(quant: Any) -> tuple[int, int]:
    """The ``[bo, bi]`` block size of a supported ``quantization_config`` (fp8, e4m3, two block sizes).

    Raises:
        BridgeError: another quantization method or format, or no block size.
    """
    if not isinstance(quant, dict) or quant.get("quant_method") != "fp8" or quant.get("fmt", "e4m3") != "e4m3":
        raise BridgeError(f"deepseek_v3 config.json quantization_config={quant!r}: only DeepSeek-V3's fp8 e4m3 "
                          "block-scaled weights are dequantized on import")
    block = quant.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise BridgeError(f"deepseek_v3 config.json quantization_config.weight_block_size={block!r} must be two "
                          "positive block sizes [rows, columns]")
    return block[0], block[1]


@lru_cache(maxsize=8)
def folder_block_size(folder: Path) -> tuple[int, int] | None:
    """The fp8 block size of a Hugging Face folder's ``config.json`` (None when it is not quantized)."""
    path = folder / "config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    quant = config.get("quantization_config")
    return None if quant is None else check_quantization_config(quant)


def dequantize(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """float32 ``weight * scale_inv`` with each scale spread over its ``block`` (ragged last blocks cut).

    Raises:
        BridgeError: the scales do not tile the weight with that block size.
    """
    rows, cols = weight.shape
    want = (-(-rows // block[0]), -(-cols // block[1]))
    if weight.dim() != 2 or tuple(scale_inv.shape) != want:
        raise BridgeError(f"fp8 weight {list(weight.shape)} needs {list(want)} block scales of {list(block)}, got "
                          f"{list(scale_inv.shape)}")
    scales = scale_inv.float().repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:rows, :cols]
    return weight.float() * scales


def read_dequantized(reader: Any, name: str) -> torch.Tensor:
    """HF tensor ``name`` from ``reader``; an fp8 weight with its ``weight_scale_inv`` comes back dequantized."""
    scale_name = name + SCALE_SUFFIX
    if scale_name not in reader.weight_map:
        return reader.get(name)
    block = folder_block_size(Path(reader.folder))
    if block is None:
        raise BridgeError(f"{str(reader.folder)!r} holds {scale_name!r} but its config.json has no "
                          "quantization_config (the block size)")
    return dequantize(reader.get(name), reader.get(scale_name), block)
