"""``model.deterministic_mode``: what a bit-reproducible run sets before training starts (Megatron-Bridge's
``apply_determinism_overrides`` and its deterministic recipes' environment)."""

import os

import torch


DETERMINISTIC_ENV: dict[str, str] = {
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "NCCL_ALGO": "Ring",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
}
"""The environment of Megatron-Bridge's ``*_deterministic`` recipes: cuBLAS with a fixed workspace, NCCL's ring
algorithm (a fixed reduction order), no non-deterministic transformer-engine kernels."""


def apply_deterministic_mode(enabled: bool) -> None:
    """With ``enabled``: set :data:`DETERMINISTIC_ENV` where the environment leaves it unset (a user's value wins)
    and ask torch for deterministic algorithms (an op without one then raises). Call before the process groups
    start, so NCCL reads ``NCCL_ALGO``. Without ``enabled``: nothing."""
    if not enabled:
        return
    for key, value in DETERMINISTIC_ENV.items():
        os.environ.setdefault(key, value)
    torch.use_deterministic_algorithms(True)
