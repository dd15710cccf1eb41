"""GPT-OSS's MXFP4 checkpoints: the experts' packed FP4 weights dequantized on import.

The published weights (``quantization_config``: ``quant_method: mxfp4``) store each expert tensor ``X``
(``mlp.experts.gate_up_proj`` ``[E, hidden, 2F]``, ``mlp.experts.down_proj`` ``[E, F, hidden]``) as two uint8
tensors, as transformers' ``integrations/mxfp4.py`` (``convert_moe_packed_tensors``) reads them:

* ``X_blocks`` ``[E, out, G, 16]``: the transposed weight ``[E, out, in]`` in blocks of 32 values along ``in``
  (``G = in / 32``), two FP4 (e2m1) values per byte, the low nibble first (even position), the high nibble second;
  a nibble indexes :data:`FP4_VALUES`;
* ``X_scales`` ``[E, out, G]``: one e8m0 exponent per block, the block's values times ``2 ** (scale - 127)``.

``X = (lut[nibbles] · 2^(scales - 127))`` reshaped to ``[E, out, in]`` and transposed to ``[E, in, out]``. One tensor
is decoded at a time, to float32 (exact: every FP4 value times a power of two is a float32 number). Biases, attention,
router, embeddings and the output layer are stored unquantized. Exports write the dequantized weights.
"""

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from megatron_bridge.errors import BridgeError


BLOCKS, SCALES = "_blocks", "_scales"
"""HF tensor ``X`` is stored as ``X_blocks`` and ``X_scales``."""
BYTES_PER_BLOCK = 16
"""32 FP4 values per scale, two per byte."""
SCALE_BIAS = 127
"""e8m0: the exponent is the stored byte minus 127."""
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
"""The e2m1 value of each 4-bit code (the high bit the sign), transformers' ``FP4_VALUES``."""


def check_quantization_config(quant: Any) -> None:
    """Accept GPT-OSS's MXFP4 ``quantization_config`` (``quant_method: mxfp4``; ``modules_to_not_convert`` and the
    other keys do not change the stored layout).

    Raises:
        BridgeError: another quantization method.
    """
    method = quant.get("quant_method") if isinstance(quant, dict) else quant
    if method != "mxfp4":
        raise BridgeError(f"gpt_oss config.json quantization_config (quant_method={method!r}): only the MXFP4 "
                          "checkpoints (quant_method 'mxfp4', expert weights as *_blocks and *_scales) are "
                          "dequantized on import")


def packed_shape(name: str, blocks: tuple[int, ...], scales: tuple[int, ...] | None) -> tuple[int, ...]:
    """The dequantized shape ``[E, in, out]`` of HF tensor ``name`` stored as ``blocks`` ``[E, out, G, 16]`` and
    ``scales`` ``[E, out, G]``.

    Raises:
        BridgeError: no scales, or shapes that do not pair up as MXFP4 blocks (names the tensors and shapes).
    """
    if scales is None:
        raise BridgeError(f"MXFP4 tensor {name + BLOCKS!r} has no {name + SCALES!r} (one e8m0 exponent per 32 "
                          "values): the checkpoint is incomplete")
    if len(blocks) != 4 or blocks[-1] != BYTES_PER_BLOCK or tuple(scales) != tuple(blocks[:-1]):
        raise BridgeError(f"MXFP4 tensor {name!r}: blocks {list(blocks)} and scales {list(scales)} must be "
                          f"[experts, out, groups, {BYTES_PER_BLOCK}] and [experts, out, groups]")
    experts, out, groups, _ = blocks
    return experts, groups * 2 * BYTES_PER_BLOCK, out


def logical_shapes(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """A folder's tensor shapes with each ``X_blocks``/``X_scales`` pair replaced by ``X`` and its dequantized shape
    (in the place of ``X_blocks``).

    Raises:
        BridgeError: blocks without scales, scales without blocks, or shapes that do not pair up.
    """
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        if name.endswith(BLOCKS):
            base = name[: -len(BLOCKS)]
            out[base] = packed_shape(base, tuple(shape), shapes.get(base + SCALES))
        elif name.endswith(SCALES):
            if name[: -len(SCALES)] + BLOCKS not in shapes:
                raise BridgeError(f"MXFP4 scales {name!r} have no {name[: -len(SCALES)] + BLOCKS!r}: the checkpoint "
                                  "is incomplete")
        else:
            out[name] = tuple(shape)
    return out


def dequantize(name: str, blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 ``[E, in, out]`` of MXFP4 ``blocks`` ``[E, out, G, 16]`` and ``scales`` ``[E, out, G]`` (module
    docstring).

    Raises:
        BridgeError: not uint8, or shapes that do not pair up.
    """
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise BridgeError(f"MXFP4 tensor {name!r}: blocks and scales must be uint8, got {blocks.dtype} and "
                          f"{scales.dtype}")
    experts, inner, outer = packed_shape(name, tuple(blocks.shape), tuple(scales.shape))
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    out = torch.empty(experts, inner, outer, dtype=torch.float32)
    for e in range(experts):  # one expert at a time: the index and exponent temporaries stay one expert's size
        values = torch.empty(*blocks.shape[1:-1], 2 * BYTES_PER_BLOCK, dtype=torch.float32)
        values[..., 0::2] = lut[(blocks[e] & 0x0F).int()]
        values[..., 1::2] = lut[(blocks[e] >> 4).int()]
        values = torch.ldexp(values, (scales[e].to(torch.int32) - SCALE_BIAS).unsqueeze(-1))
        out[e] = values.reshape(outer, inner).T
    return out


@lru_cache(maxsize=8)
def folder_is_quantized(folder: Path) -> bool:
    """Whether a Hugging Face folder's ``config.json`` declares MXFP4 (checked: no other method)."""
    path = folder / "config.json"
    quant = json.loads(path.read_text()).get("quantization_config") if path.is_file() else None
    if quant is not None:
        check_quantization_config(quant)
    return quant is not None


def read_dequantized(reader: Any, name: str) -> torch.Tensor:
    """HF tensor ``name`` from ``reader``: stored as it is, or (stored as ``name_blocks`` and ``name_scales``)
    dequantized.

    Raises:
        BridgeError: packed tensors in a folder whose config.json declares no ``quantization_config``.
    """
    if name in reader.weight_map or name + BLOCKS not in reader.weight_map:
        return reader.get(name)
    if not folder_is_quantized(Path(reader.folder)):
        raise BridgeError(f"{str(reader.folder)!r} holds MXFP4 {name + BLOCKS!r} but its config.json has no "
                          "quantization_config (quant_method 'mxfp4')")
    return dequantize(name, reader.get(name + BLOCKS), reader.get(name + SCALES))
