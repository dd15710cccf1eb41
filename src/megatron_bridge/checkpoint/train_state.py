"""``TrainState``: the counters of a run that a checkpoint restores."""

from dataclasses import asdict, dataclass, fields
from typing import Any


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

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counters; unknown keys are ignored, missing ones keep their value."""
        for f in fields(self):
            if f.name in state:
                setattr(self, f.name, type(getattr(self, f.name))(state[f.name]))
