"""Honest accounting of the tensor bytes a conversion holds at once (the streaming guarantee, measured).

Every tensor the bridge materializes (read from a shard, padded, cast) is registered with :func:`track`. While a
:class:`TensorMeter` is active, it adds the tensor's storage bytes and subtracts them when Python frees the tensor
(a ``weakref.finalize``), so ``peak_bytes`` is the largest amount of converted tensor data that was alive at the
same time, however long the library kept references. Nothing is tracked when no meter is active.
"""

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch


_ACTIVE: list["TensorMeter"] = []


class TensorMeter:
    """Live and peak bytes of the tensors registered with :func:`track` while this meter is active."""

    def __init__(self) -> None:
        self.current_bytes = 0
        self.peak_bytes = 0
        self.tracked = 0
        self._storages: dict[int, int] = {}
        self._lock = threading.Lock()

    def _add(self, key: int, nbytes: int) -> None:
        with self._lock:
            count = self._storages.get(key, 0)
            self._storages[key] = count + 1
            if count == 0:
                self.current_bytes += nbytes
                self.peak_bytes = max(self.peak_bytes, self.current_bytes)

    def _release(self, key: int, nbytes: int) -> None:
        with self._lock:
            count = self._storages.get(key, 0) - 1
            if count <= 0:
                self._storages.pop(key, None)
                self.current_bytes -= nbytes
            else:
                self._storages[key] = count

    def register(self, tensor: torch.Tensor) -> None:
        """Count ``tensor``'s storage until the tensor object is freed (shared storages count once)."""
        storage = tensor.untyped_storage()
        key, nbytes = storage.data_ptr(), storage.nbytes()
        self.tracked += 1
        self._add(key, nbytes)
        weakref.finalize(tensor, self._release, key, nbytes)

    @contextmanager
    def measure(self) -> Iterator["TensorMeter"]:
        """Activate this meter for the block."""
        _ACTIVE.append(self)
        try:
            yield self
        finally:
            _ACTIVE.remove(self)


def track(tensor: torch.Tensor) -> torch.Tensor:
    """Register ``tensor`` with the active meters (if any); returns it."""
    for meter in _ACTIVE:
        meter.register(tensor)
    return tensor
