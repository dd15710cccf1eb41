"""The query blocks of soft-capped attention (:mod:`megatron_bridge.models.softcapping`), torch-free so that the
activation estimate (:mod:`megatron_bridge.perf.activations`) counts the same blocks the model computes."""

BLOCK_ELEMENTS = 1 << 24
"""Scores computed at once at most (queries × keys × batch × heads, ~64 MiB in fp32)."""
BLOCK_ROWS = 256
"""Queries per block at most: smaller blocks skip more of the keys a causal mask hides (each block computes the keys
up to its last query), at more Python steps."""
WORKSPACE_TENSORS = 5
"""fp32 tensors of one block's ``[batch, heads, rows, keys]`` shape alive at once in the backward (scores, their
tanh, the probabilities, their gradient, the scores' gradient), measured on the tiny Gemma 2
(tests/unit_tests/perf/test_memory_measure.py)."""


def block_rows(batch: int, heads: int, queries: int, keys: int) -> int:
    """Queries per block for ``batch × heads`` rows of ``queries`` over ``keys``."""
    return max(1, min(queries, BLOCK_ROWS, BLOCK_ELEMENTS // max(1, batch * heads * keys)))


def workspace_bytes(batch: int, heads: int, queries: int, keys: int) -> int:
    """Bytes of one block's transient scores and gradients in the backward (:data:`WORKSPACE_TENSORS` in fp32)."""
    return WORKSPACE_TENSORS * 4 * batch * heads * block_rows(batch, heads, queries, keys) * keys
