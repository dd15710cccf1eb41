"""The ``config.json`` an export writes: the source folder's own file, changed only where the model differs.

An export usually has a source ``config.json`` (the folder the model was imported from, kept in the checkpoint's
``hf_assets/``). Writing a fresh file from :class:`ModelConfig` would drift from it: keys transformers no longer
writes, keys under an older name (``num_local_experts``), values the model does not use (Qwen3's
``max_window_layers``), token ids taken from ``generation_config.json``. So the source file is the base, and a key
is rewritten only when the value the model implies differs from the value the source implies (both rendered by the
family's :meth:`~megatron_bridge.bridge.families.base.ModelFamily.config_to_hf`). An unchanged model therefore
round-trips its ``config.json`` exactly; a changed one (another width, dtype, RoPE format) changes just those keys.
"""

from typing import Any

from megatron_bridge.bridge.families.base import ModelFamily
from megatron_bridge.bridge.rope import RopeFormat, rope_format_of
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError
from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)

TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
ROPE_KEYS = ("rope_parameters", "rope_scaling", "rope_theta")
KEY_ALIASES = {"dtype": "torch_dtype", "num_experts": "num_local_experts"}
"""Our key → the other name transformers writes it under; a source using the other name keeps it."""


def exported_hf_config(family: ModelFamily, config: ModelConfig, *, dtype: str, rope_format: RopeFormat | None,
                       source: dict[str, Any] | None, token_ids: dict[str, Any]) -> dict[str, Any]:
    """The ``config.json`` of an export of ``config`` (module docstring).

    Args:
        dtype: name of the written weights' dtype (``"bfloat16"``, ...).
        rope_format: RoPE format to write; None keeps the source's (``rope_parameters`` without a source).
        source: the source folder's ``config.json``, or None.
        token_ids: special token ids written when there is no source (a source's own ids are kept as they are).
    """
    fmt = rope_format or (rope_format_of(source) if source else "rope_parameters")
    ours = family.config_to_hf(config, rope_format=fmt, dtype=dtype)
    if source is None:
        ids = valid_token_ids(token_ids, config.vocab_size)
        return {**ours, **{k: ids.get(k) for k in TOKEN_ID_KEYS}}
    theirs = _source_rendering(family, source, fmt)
    out = {k: v for k, v in source.items() if k != "quantization_config"}  # exports write unquantized weights
    if fmt != rope_format_of(source):  # RoPE asked for in the other transformers format
        for key in ROPE_KEYS:
            out.pop(key, None)
        out.update({k: v for k, v in ours.items() if k in ROPE_KEYS})
    for key, value in ours.items():
        if theirs.get(key) != value:  # the model changed what this key says
            out[_alias_in(key, out) or key] = value
    for key in TOKEN_ID_KEYS:  # the source's own ids (not generation_config.json's), if still in the vocabulary
        if source.get(key) is not None:
            out.update(valid_token_ids({key: source[key]}, config.vocab_size) or {key: None})
    return out


def _alias_in(key: str, hf: dict[str, Any]) -> str | None:
    """The other name of ``key`` when ``hf`` uses that one instead."""
    alias = KEY_ALIASES.get(key)
    return alias if alias is not None and alias in hf and key not in hf else None


def _source_rendering(family: ModelFamily, source: dict[str, Any], fmt: RopeFormat) -> dict[str, Any]:
    """The source ``config.json`` as the family renders it (what an unchanged model would write); empty when the
    source is not a config of this family (then every derived key is written)."""
    try:
        source_model = family.config_from_hf(source)
        dtype = source.get("dtype") or source.get("torch_dtype") or "float32"
        return family.config_to_hf(source_model, rope_format=fmt, dtype=dtype)
    except BridgeError as exc:
        logger.warning("the source config.json is not a %s config (%s): writing every key from the model",
                       family.name, exc)
        return {}


def valid_token_ids(ids: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """``ids`` without those outside ``[0, vocab_size)`` (warned: transformers would refuse them)."""
    out = {}
    for key, value in ids.items():
        values = value if isinstance(value, list) else [value]
        if all(isinstance(v, int) and 0 <= v < vocab_size for v in values):
            out[key] = value
        else:
            logger.warning("not writing %s=%s: outside the vocabulary [0, %d)", key, value, vocab_size)
    return out
