"""``TrainState``: the counters of a run that a checkpoint restores."""

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from megatron_bridge.errors import CheckpointError


@dataclass
class TrainState:
    """Progress of a training run (saved as ``train_state.pt`` in every checkpoint)."""

    step: int = 0
    """Optimizer steps done."""
    consumed_train_samples: int = 0
    """Training samples consumed over all data-parallel ranks (the data iterator position)."""
    consumed_valid_samples: int = 0
    """Validation samples consumed over all data-parallel ranks."""
    floating_point_operations_so_far: float = 0.0
    """Model FLOPs done so far (for throughput accounting across restarts)."""
    skipped_train_samples: int = 0
    """Samples of skipped steps (fp16 overflow)."""

    def state_dict(self) -> dict[str, Any]:
        """Plain dict of the counters (safe for ``torch.load(weights_only=True)``)."""
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any], source: str = "the train state") -> None:
        """Restore counters; unknown keys are ignored, missing ones keep their value. Each value must be a
        non-negative number of the field's type (a one-element tensor too: Megatron-Bridge saves 0-d tensors).

        Raises:
            CheckpointError: a value of another type (``source`` names the file), nothing restored.
        """
        restored = {f.name: _counter(state[f.name], type(getattr(self, f.name)), f.name, source)
                    for f in fields(self) if f.name in state}
        for name, value in restored.items():
            setattr(self, name, value)


def _counter(value: Any, kind: type, name: str, source: str) -> int | float:
    """``value`` as a non-negative ``kind`` (int or float), or CheckpointError."""
    import torch

    if isinstance(value, torch.Tensor) and value.numel() == 1 and (kind is float or not value.is_floating_point()):
        value = value.item()
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if ok and (kind is float or isinstance(value, int)):
        return kind(value)
    raise CheckpointError(
        f"{source}: field {name!r} holds {value!r} ({type(value).__name__}), not a non-negative {kind.__name__}: the "
        "checkpoint's train state is corrupt. Fix: load another step with checkpoint.ckpt_step")
