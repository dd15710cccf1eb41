"""Rank and world-size queries that work with or without an initialized process group."""

import os


def _dist_initialized() -> bool:
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def get_world_size() -> int:
    """World size from the process group, else ``WORLD_SIZE``, else 1."""
    if _dist_initialized():
        import torch.distributed as dist

        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def get_rank() -> int:
    """Global rank from the process group, else ``RANK``, else 0."""
    if _dist_initialized():
        import torch.distributed as dist

        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def get_local_rank() -> int:
    """Local rank from ``LOCAL_RANK``, else 0."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def node_index() -> int | None:
    """This worker's node (torch's launcher sets ``GROUP_RANK``) in a job over several nodes
    (``GROUP_WORLD_SIZE`` > 1); None on one node or outside torchrun."""
    if int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1) <= 1 or "GROUP_RANK" not in os.environ:
        return None
    return int(os.environ["GROUP_RANK"])


def is_last_rank() -> bool:
    """True on the rank that prints the training log (the last one, as in Megatron)."""
    return get_rank() == get_world_size() - 1
