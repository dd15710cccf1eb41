"""Measured per-rank memory of a ``pretrain()`` run, to check the estimate of :mod:`megatron_bridge.perf.memory`.

Method (the same on CPU and CUDA): ``torch.profiler`` with ``profile_memory=True`` records every allocation and free
of torch's allocator on the training device with its size (the ``[memory]`` events of the kineto event list). Summed
in time order they give the bytes allocated at every instant. :class:`AllocationRecorder` is a training callback that
marks the start of training and the end of every step, so:

* **peak** = the largest running sum between the start of training (after set-up) and the end of the last step;
* frees on threads the profiler does not see (gloo's and NCCL's workers drop the last reference to a collective's
  buffers) are missing from the events; an allocation at an address that is still live proves the earlier block
  was freed and drops it, and a missed free whose address is not reused before the end stays counted, so the
  peak is an upper bound (on CPU with FSDP2: at most a few unsharded blocks).

**State** (parameters + gradients + optimizer state) is measured by tensor-storage accounting at the end of the
last step (after ``optimizer.step()``, before the next ``zero_grad``): the bytes of the distinct storages of the
wrapped model's parameters (local shards of DTensors), their gradients and every tensor in the optimizer's state.
DDP's flat gradient buckets live in C++ and are not in it (the estimate counts them as buffers).

Neither counts Python objects, gloo/NCCL internals or allocator caching: RSS would include the runtime, and the
CUDA caching allocator's reserved bytes include fragmentation. The profiler slows steps down, so throughput is
measured in a separate, unprofiled run.
"""

from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from megatron_bridge.training.callbacks import Callback


TRAIN_START = "megatron_bridge::train_start"
STEP_END = "megatron_bridge::step_end"


@dataclass(frozen=True)
class MeasuredMemory:
    """Allocator bytes of one rank during training."""

    peak_bytes: int
    state_bytes: int
    """Parameters + gradients + optimizer state at the end of the last step (storage accounting)."""
    allocated_at_step_end: int
    """The allocator's running sum at the end of the last step (state + DDP buckets + missed frees)."""
    start_bytes: int
    """Allocated when training started (model, wrappers; no optimizer state yet)."""


class AllocationRecorder(Callback):
    """A context manager around ``pretrain(cfg, callbacks=[recorder])`` that records allocator events.

    Args:
        device: the training device; only its allocator's events count.
    """

    def __init__(self, device: torch.device) -> None:
        self.device_type = "CUDA" if torch.device(device).type == "cuda" else "CPU"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device_type == "CUDA" else [])
        self._profile = profile(activities=activities, profile_memory=True)
        self._state_bytes = 0

    def __enter__(self) -> "AllocationRecorder":
        self._profile.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._profile.__exit__(*exc)

    def on_train_start(self, ctx: Any) -> None:
        """Mark the start of training."""
        with record_function(TRAIN_START):
            pass

    def on_train_step_end(self, ctx: Any) -> None:
        """Let in-flight collectives finish (a barrier, a garbage collection, a short pause), account the state's
        storages, then mark the end of the step."""
        import gc
        import time

        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        gc.collect()
        time.sleep(0.05)
        self._state_bytes = state_storage_bytes(ctx.backend.chunks, ctx.optimizer)
        with record_function(STEP_END):
            pass

    def result(self) -> MeasuredMemory:
        """Peak and end-of-step bytes (call after the ``with`` block)."""
        allocs, marks = [], []
        stack = list(self._profile.profiler.kineto_results.experimental_event_tree())
        while stack:
            event = stack.pop()
            stack.extend(event.children)
            fields = event.typed[1]
            if type(fields).__name__ == "_ExtraFields_Allocation":
                if self.device_type.lower() in str(fields.device).lower():
                    allocs.append((event.start_time_ns, fields.ptr, fields.alloc_size))
            elif event.name in (TRAIN_START, STEP_END):
                marks.append((event.start_time_ns, event.name))
        measured = running_sum_stats(sorted(allocs), sorted(marks))
        return MeasuredMemory(measured.peak_bytes, self._state_bytes, measured.allocated_at_step_end,
                              measured.start_bytes)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def state_storage_bytes(chunks: list[torch.nn.Module], optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the distinct storages of the chunks' parameters, their gradients and the optimizer's state tensors."""
    tensors = []
    for chunk in chunks:
        for param in chunk.parameters():
            tensors.append(param)
            if param.grad is not None:
                tensors.append(param.grad)
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return sum(storage_bytes(tensors).values())


def storage_bytes(tensors: list[torch.Tensor]) -> dict[int, int]:
    """Bytes of each distinct storage behind ``tensors`` (local shards of DTensors; views of one buffer count once;
    meta tensors have none), by address."""
    storages = {}
    for tensor in tensors:
        storage = _local(tensor).untyped_storage()
        if storage.device.type != "meta":
            storages[storage.data_ptr()] = storage.nbytes()
    return storages


def running_sum_stats(allocs: list[tuple[int, int, int]], marks: list[tuple[int, str]]) -> MeasuredMemory:
    """Bytes live over time from ``(time, address, ±bytes)`` allocator events: the peak after the first
    ``TRAIN_START`` mark, the bytes at the last ``STEP_END`` mark and at the start mark (pure; unit-tested).

    Frees happen on whichever thread drops the last reference; those on threads the profiler does not see (gloo's
    and NCCL's workers) are missing from the events. An allocation at an address that is still live proves the
    earlier block was freed, so it is dropped then: without that, every missed free would look like a leak.
    """
    start_t = next((t for t, name in marks if name == TRAIN_START), None)
    step_ts = [t for t, name in marks if name == STEP_END]
    if start_t is None or not step_ts:
        raise ValueError("no training-start / step-end marks were recorded: pass the recorder to pretrain(callbacks=)")
    live: dict[int, int] = {}
    running = peak = start = 0
    for t, ptr, nbytes in allocs:
        if t > step_ts[-1]:
            break
        if nbytes > 0:
            running += nbytes - live.pop(ptr, 0)
            live[ptr] = nbytes
        else:
            running -= live.pop(ptr, 0)
        if t <= start_t:
            start = running
        else:
            peak = max(peak, running)
    return MeasuredMemory(peak_bytes=max(peak, start), state_bytes=0, allocated_at_step_end=running,
                          start_bytes=start)
