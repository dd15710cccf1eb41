"""Per-rank RNG states (Python, NumPy, torch CPU, CUDA) as plain tensors and numbers.

Each rank writes ``rng_rank_<rank>.pt`` into the checkpoint folder. The content is only tensors, ints, floats,
strings and tuples, so it loads with ``torch.load(weights_only=True)``.
"""

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from megatron_bridge.checkpoint.files import fsync_file
from megatron_bridge.checkpoint.reader import load_torch_file
from megatron_bridge.errors import CheckpointError


def rng_filename(rank: int) -> str:
    """File name of a rank's RNG states: ``rng_rank_00000.pt``."""
    return f"rng_rank_{rank:05d}.pt"


def get_rng_state() -> dict[str, Any]:
    """This process's RNG states, in a form that ``torch.load(weights_only=True)`` accepts."""
    version, mt_state, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": (int(version), torch.tensor(mt_state, dtype=torch.int64), gauss),
        "numpy": (str(np_name), torch.from_numpy(np.asarray(np_keys, dtype=np.int64)), int(np_pos),
                  int(np_has_gauss), float(np_gauss)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`get_rng_state` returned (CUDA states only when CUDA is available)."""
    try:
        version, mt_state, gauss = state["python"]
        random.setstate((version, tuple(int(x) for x in mt_state.tolist()), gauss))
        np_name, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
        np.random.set_state((np_name, np_keys.numpy().astype(np.uint32), np_pos, np_has_gauss, np_gauss))
        torch.set_rng_state(state["torch"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"RNG state in the checkpoint is malformed: {exc}") from exc
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            torch.cuda.set_rng_state(cuda_states[torch.cuda.current_device() % len(cuda_states)])


def save_rng_file(folder: str | Path, rank: int, world_size: int) -> None:
    """Write this rank's RNG states into ``folder`` (fsynced)."""
    path = Path(folder) / rng_filename(rank)
    torch.save({"rank": rank, "world_size": world_size, "state": get_rng_state()}, path)
    fsync_file(path)


def load_rng_file(folder: str | Path, rank: int, world_size: int) -> bool:
    """Restore this rank's RNG states from ``folder``. Returns False (nothing restored) when the checkpoint was
    written with another world size or holds no file for this rank."""
    path = Path(folder) / rng_filename(rank)
    if not path.is_file():
        return False
    content = load_torch_file(path, "RNG state")
    if not isinstance(content, dict) or "state" not in content:
        raise CheckpointError(f"RNG state file {str(path)!r} is malformed")
    if content.get("world_size") != world_size:
        return False
    set_rng_state(content["state"])
    return True
