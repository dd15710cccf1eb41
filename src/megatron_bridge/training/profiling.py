"""``cfg.profiling``: a torch.profiler trace and a CUDA memory snapshot over a window of steps."""

import os
from pathlib import Path
from typing import Any

import torch

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)


class StepProfiler:
    """Starts before step ``profile_step_start`` and stops after step ``profile_step_end - 1`` on ``profile_ranks``.

    ``step_begin(step)`` is called before a step runs (``step`` = steps done so far), ``step_end(step)`` after it.
    """

    def __init__(self, cfg: ConfigContainer, rank: int, device: torch.device) -> None:
        p = cfg.profiling
        self.cfg = p
        self.rank = rank
        self.device = device
        self.enabled = rank in p.profile_ranks and (p.use_pytorch_profiler or p.record_memory_history)
        self._profiler: Any = None
        self._recording_memory = False
        if self.enabled and p.record_memory_history and device.type != "cuda":
            logger.warning("profiling.record_memory_history needs CUDA; skipped on %s", device.type)

    def step_begin(self, step: int) -> None:
        """Start the trace / memory history when the window opens."""
        if not self.enabled or step != self.cfg.profile_step_start:
            return
        if self.cfg.use_pytorch_profiler:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities, record_shapes=self.cfg.record_shapes)
            self._profiler.__enter__()
        if self.cfg.record_memory_history and self.device.type == "cuda":
            torch.cuda.memory._record_memory_history()
            self._recording_memory = True

    def step_end(self, step: int) -> None:
        """Stop and write the outputs when the window closes (``step`` = steps done after this one)."""
        if not self.enabled or step != self.cfg.profile_step_end:
            return
        self.close()

    def close(self) -> None:
        """Write whatever is still being recorded (also called when training stops inside the window)."""
        if self._profiler is not None:
            self._profiler.__exit__(None, None, None)
            folder = Path(self.cfg.trace_dir or "profile")
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"trace_rank{self.rank}.json"
            self._profiler.export_chrome_trace(str(path))
            logger.info("profiler trace of steps %d-%d written to %s", self.cfg.profile_step_start + 1,
                        self.cfg.profile_step_end, path)
            self._profiler = None
        if self._recording_memory:
            root, ext = os.path.splitext(self.cfg.memory_snapshot_path)
            path = f"{root}_rank{self.rank}{ext}"
            torch.cuda.memory._dump_snapshot(path)
            torch.cuda.memory._record_memory_history(enabled=None)
            logger.info("CUDA memory snapshot written to %s", path)
            self._recording_memory = False
