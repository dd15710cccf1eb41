"""Per-step bookkeeping of multi-token prediction (``model.mtp_num_layers``, :mod:`megatron_bridge.models.mtp`) in
the training loop: the MTP loss's gradient scale and the per-depth losses that are logged.

Megatron-core's ``MTPLossLoggingHelper`` likewise logs ``mtp_{k} loss``: each depth's loss averaged over the step's
micro-batches and the data-parallel ranks (here: over every rank's records, one all-reduce per step).
"""

import torch
import torch.distributed as dist
from torch import nn

from megatron_bridge.models.mtp import MultiTokenPrediction, mtp_modules, set_mtp_loss_scale


class MTPTracker:
    """Finds the :class:`MultiTokenPrediction` modules of the (unwrapped) model chunks; :meth:`begin_step` and
    :meth:`end_step` around each training step; :attr:`last` holds the last step's ``{"mtp_1 loss": ...}``."""

    def __init__(self, modules: list[MultiTokenPrediction], device: torch.device, depths: int) -> None:
        self.modules = modules
        self.device = device
        self.depths = depths
        self.last: dict[str, float] = {}
        self.num_microbatches: int | None = None

    @classmethod
    def for_chunks(cls, chunks: list[nn.Module], device: torch.device, depths: int) -> "MTPTracker | None":
        """A tracker over the MTP modules of ``chunks``, or None when the model has no MTP (``depths`` 0)."""
        if not depths:
            return None
        return cls([m for chunk in chunks for m in mtp_modules(chunk)], device, depths)

    def begin_step(self, num_microbatches: int, loss_scale: float = 1.0) -> None:
        """The MTP loss's gradient is scaled by ``loss_scale / num_microbatches``: the mean over the step's
        micro-batches (megatron-core's ``MTPLossAutoScaler.set_loss_scale``)."""
        self.num_microbatches = num_microbatches
        set_mtp_loss_scale(loss_scale / num_microbatches)

    @torch.no_grad()
    def end_step(self) -> dict[str, float]:
        """Every depth's loss of the step (mean over micro-batches and ranks); resets the records."""
        table = torch.zeros(self.depths + 1, dtype=torch.float64)
        for module in self.modules:
            sums, count = module.step_records(self.num_microbatches)
            table[: len(sums)] += torch.tensor(sums, dtype=torch.float64)
            table[-1] += count
            module.reset_step_stats()
        table = table.to(self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(table)
        table = table.cpu()
        count = float(table[-1])
        self.last = {f"mtp_{k + 1} loss": float(table[k]) / count for k in range(self.depths)} if count else {}
        return self.last
