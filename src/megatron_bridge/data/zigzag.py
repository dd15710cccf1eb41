"""The zig-zag context-parallel sequence layout: which tokens each CP rank holds, and cutting batches to it.

With ``model.context_parallel_size = P > 1`` every sequence of ``S`` tokens is cut into ``2P`` chunks of ``S / 2P``
tokens; CP rank ``r`` holds chunks ``r`` and ``2P - 1 - r`` (zig-zag, "head-tail"), so every rank gets one early and
one late chunk and the causal attention work is the same on every rank (:func:`attention_work`).

* :func:`zigzag_positions` — the absolute sequence positions a CP rank holds, in its local order.
* :func:`slice_batch_for_context_parallel` — a batch's ``tokens``, ``labels``, ``loss_mask``, ``position_ids`` (and any
  other ``[b, s]`` tensor) cut to this rank's zig-zag slice (Megatron's ``get_batch_on_this_cp_rank``). The data
  loaders apply it (:class:`ContextParallelCollate`), so every CP rank of a data-parallel group reads the same samples
  and keeps its slice.
* :func:`query_blocks`, :func:`attention_work` — the attention calls of a rank and their work.

Wiring a model for CP is :mod:`megatron_bridge.distributed.context_parallel`; the attention itself is
:mod:`megatron_bridge.distributed.cp_attention`.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from megatron_bridge.errors import ConfigValidationError


def zigzag_chunk_ids(cp_size: int, cp_rank: int) -> tuple[int, int]:
    """The two chunk indices (of ``2 * cp_size``) that CP rank ``cp_rank`` holds: ``(r, 2P - 1 - r)``."""
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank={cp_rank} must be in [0, cp_size={cp_size})")
    return cp_rank, 2 * cp_size - 1 - cp_rank


def _chunk_len(seq_len: int, cp_size: int) -> int:
    if seq_len % (2 * cp_size):
        raise ConfigValidationError(
            f"sequence length {seq_len} is not divisible by 2×model.context_parallel_size = {2 * cp_size}: the "
            "zig-zag layout cuts every sequence into 2×CP equal chunks; change model.seq_length or the CP size.",
            ("model.seq_length", "model.context_parallel_size"),
        )
    return seq_len // (2 * cp_size)


def zigzag_positions(seq_len: int, cp_size: int, cp_rank: int, device: torch.device | str | None = None
                     ) -> torch.Tensor:
    """Absolute positions (``int64``, shape ``[seq_len / cp_size]``) of the tokens CP rank ``cp_rank`` holds."""
    c = _chunk_len(seq_len, cp_size)
    return torch.cat([torch.arange(i * c, (i + 1) * c, device=device) for i in zigzag_chunk_ids(cp_size, cp_rank)])


def gathered_positions(seq_len: int, cp_size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Absolute positions of the tokens after an all-gather over the CP group (rank 0's slice first)."""
    return torch.cat([zigzag_positions(seq_len, cp_size, r, device) for r in range(cp_size)])


def zigzag_slice(tensor: torch.Tensor, cp_size: int, cp_rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's zig-zag slice of ``tensor`` along ``dim`` (the sequence dimension)."""
    c = _chunk_len(tensor.shape[dim], cp_size)
    first, second = zigzag_chunk_ids(cp_size, cp_rank)
    return torch.cat([tensor.narrow(dim, first * c, c), tensor.narrow(dim, second * c, c)], dim=dim)


SEQUENCE_KEYS = ("tokens", "labels", "loss_mask", "position_ids", "attention_mask", "segment_ids")
"""Batch entries cut along the sequence by :func:`slice_batch_for_context_parallel` (when present)."""


def slice_batch_for_context_parallel(batch: dict[str, Any], cp_size: int, cp_rank: int) -> dict[str, Any]:
    """``batch`` with every ``[b, s]`` entry of :data:`SEQUENCE_KEYS` cut to this rank's zig-zag slice.

    Missing ``position_ids`` are added first (``0 .. s-1``), so RoPE sees the absolute positions of the slice.
    ``cp_size == 1`` returns the batch unchanged.
    """
    if cp_size == 1:
        return batch
    out = dict(batch)
    tokens = batch["tokens"]
    if "position_ids" not in out:
        out["position_ids"] = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    for key in SEQUENCE_KEYS:
        value = out.get(key)
        if isinstance(value, torch.Tensor) and value.dim() >= 2:
            out[key] = zigzag_slice(value, cp_size, cp_rank, dim=1)
    return out


class ContextParallelCollate:
    """DataLoader ``collate_fn``: torch's default collation, then :func:`slice_batch_for_context_parallel`.

    A class (not a closure) so DataLoader workers can pickle it.
    """

    def __init__(self, cp_size: int, cp_rank: int) -> None:
        self.cp_size = cp_size
        self.cp_rank = cp_rank

    def __call__(self, samples: list[Any]) -> dict[str, Any]:
        from torch.utils.data import default_collate

        return slice_batch_for_context_parallel(default_collate(samples), self.cp_size, self.cp_rank)


# ---------------------------------------------------------------------------------------------- work balance
@dataclass(frozen=True)
class QueryBlock:
    """One attention call of the all-gather-KV scheme: ``q_len`` local queries (from local row ``q_start``) of global
    chunk ``chunk`` attend to the first ``kv_len`` keys of the sequence (a causal prefix)."""

    chunk: int
    q_start: int
    q_len: int
    kv_len: int


def query_blocks(chunk_ids: Sequence[int], chunk_len: int) -> list[QueryBlock]:
    """The attention calls for a rank holding ``chunk_ids`` (local order): chunk ``c`` needs keys ``[0, (c+1)·C)``."""
    return [QueryBlock(c, i * chunk_len, chunk_len, (c + 1) * chunk_len) for i, c in enumerate(chunk_ids)]


def attention_work(seq_len: int, cp_size: int, cp_rank: int, *, layout: str = "zigzag") -> tuple[int, int]:
    """``(computed, causal)`` score entries of one head on one CP rank: ``computed`` = query × key entries the
    attention calls of :func:`query_blocks` evaluate, ``causal`` = those the causal mask keeps.

    ``layout="contiguous"`` gives the same numbers for the naive split (rank ``r`` holds chunks ``2r, 2r+1``) for
    comparison.
    """
    c = _chunk_len(seq_len, cp_size)
    if layout == "zigzag":
        ids: tuple[int, int] = zigzag_chunk_ids(cp_size, cp_rank)
    elif layout == "contiguous":
        ids = (2 * cp_rank, 2 * cp_rank + 1)
    else:
        raise ValueError(f"unknown layout {layout!r}")
    blocks = query_blocks(ids, c)
    computed = sum(b.q_len * b.kv_len for b in blocks)
    causal = sum(p + 1 for b in blocks for p in range(b.chunk * c, (b.chunk + 1) * c))
    return computed, causal
