"""The query blocks of soft-capped attention (:mod:`megatron_bridge.models.softcapping`), torch-free so that the
activation estimate (:mod:`megatron_bridge.perf.activations`) counts the same blocks the model computes."""

BLOCK_ELEMENTS = 1 << 24
"""Scores computed at once at most (queries × keys × batch × heads, ~64 MiB in fp32)."""
BLOCK_ROWS = {"cpu": 64}
"""Queries per block at most, by device type (:data:`DEFAULT_BLOCK_ROWS` elsewhere): smaller blocks skip more of the
keys a causal or window mask hides (each block computes only the span of keys its rows see), at more steps. On CPU
64 rows took 0.35-0.68x the time of the whole scores at 2048-4096 tokens (full and window layers) and 1.2-1.4x for a
128-token window at 1024 tokens (scripts/performance/softcap_attention.py, docs/performance.md); on a GPU every step
is a round of kernel launches, so blocks are larger there (not measured: no GPU was lent)."""
DEFAULT_BLOCK_ROWS = 256
WORKSPACE_TENSORS = 5
"""fp32 tensors of one block's ``[batch, heads, rows, keys]`` shape alive at once in the backward (scores, their
tanh, the probabilities, their gradient, the scores' gradient), measured on the tiny Gemma 2
(tests/unit_tests/perf/test_memory_measure.py)."""


def block_rows(batch: int, heads: int, queries: int, keys: int, device_type: str) -> int:
    """Queries per block for ``batch × heads`` rows of ``queries`` over ``keys`` on ``device_type``."""
    rows = BLOCK_ROWS.get(device_type, DEFAULT_BLOCK_ROWS)
    return max(1, min(queries, rows, BLOCK_ELEMENTS // max(1, batch * heads * keys)))


def workspace_bytes(batch: int, heads: int, queries: int, keys: int, device_type: str) -> int:
    """Bytes of one block's transient scores and gradients in the backward (:data:`WORKSPACE_TENSORS` in fp32), at
    most: a block's keys are the span its rows see, up to all ``keys``."""
    return WORKSPACE_TENSORS * 4 * batch * heads * block_rows(batch, heads, queries, keys, device_type) * keys
