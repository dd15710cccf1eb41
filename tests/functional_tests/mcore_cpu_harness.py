"""Test-only: run megatron-core's CUDA code path on CPU/gloo. Never imported by the library.

megatron-core (0.19) hard-codes CUDA where this library's engine would take a device (the list was found one call at a
time; /work/shared/reference/engine-feasibility.md):

* tensor factories with ``device="cuda"`` or ``device=torch.cuda.current_device()`` (causal mask, grad-norm
  buffers, gradient buckets, TP all-gather outputs), ``Tensor.cuda()`` and ``.to("cuda")``;
* ``torch.cuda.current_device()`` used as a device (custom autograd Functions allocate with it in backward);
* the model-parallel RNG tracker: ``torch.cuda.manual_seed`` / ``get_rng_state`` and megatron-core's
  ``_get_cuda_rng_state`` / ``_set_cuda_rng_state``;
* CUDA streams and events (DDP's communication stream), ``torch.cuda.synchronize`` / ``empty_cache``;
* ``Tensor.type() == "torch.cuda.FloatTensor"`` asserted by gradient clipping.

:func:`install` redirects all of them to the CPU: a process-wide :class:`torch.overrides.TorchFunctionMode` rewrites
every CUDA ``device`` argument to ``"cpu"`` (factories, ``.to``, ``.cuda``) and answers ``Tensor.type()`` of a CPU
tensor with its CUDA name; ``torch.cuda.current_device`` returns ``"cpu"``; the RNG calls use the CPU generator;
streams and events come from the Megatron FSDP harness (no-ops; everything runs in program order). It also disables
the engine's CUDA guard (:func:`megatron_bridge.models.mcore.parallel_state.require_cuda`). Numbers are megatron-core's
own: nothing in its arithmetic is replaced.

``sitecustomize`` in ``tests/functional_tests/mcore_cpu/`` installs it in subprocesses (torchrun workers of
``run_recipe.py``) when ``MEGATRON_BRIDGE_MCORE_CPU_HARNESS=1``.
"""

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from tests.functional_tests.megatron_fsdp_cpu_harness import _STREAM, _FakeEvent, _FakeStream


ENV_FLAG = "MEGATRON_BRIDGE_MCORE_CPU_HARNESS"
"""Environment variable that makes ``tests/functional_tests/mcore_cpu/sitecustomize.py`` call :func:`install`."""

_MODE: "_CudaToCpu | None" = None
_TYPE_NAMES = {torch.float32: "torch.cuda.FloatTensor", torch.float16: "torch.cuda.HalfTensor",
               torch.bfloat16: "torch.cuda.BFloat16Tensor"}


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)


class _CudaToCpu(TorchFunctionMode):
    """Every CUDA device argument becomes the CPU; ``Tensor.type()`` of a CPU tensor reads as its CUDA type."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs and args[0].device.type == "cpu":
            return _TYPE_NAMES.get(args[0].dtype, func(*args))
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


def _set_rng_state(new_state: torch.Tensor, device: Any = -1, graph_safe: bool = False) -> None:
    torch.set_rng_state(new_state)


def _get_rng_state(device: Any = "cuda", clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    return torch.get_rng_state()


def install() -> None:
    """Apply every redirection of the module docstring in this process (idempotent)."""
    global _MODE
    if _MODE is not None:
        return
    if torch.cuda.is_available():
        raise RuntimeError("the megatron-core CPU harness replaces CUDA calls: never install it with CUDA present")
    import megatron.core.tensor_parallel.random as mcore_random

    from megatron_bridge.models.mcore import parallel_state

    cuda = torch.cuda
    cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    cuda.Stream = _FakeStream  # type: ignore[misc,assignment]
    cuda.Event = _FakeEvent  # type: ignore[misc,assignment]
    cuda.stream = lambda stream=None: nullcontext()  # type: ignore[assignment]
    cuda.current_stream = lambda device=None: _STREAM  # type: ignore[assignment]
    cuda.synchronize = lambda device=None: None  # type: ignore[assignment]
    cuda.empty_cache = lambda: None  # type: ignore[assignment]
    cuda.manual_seed = torch.manual_seed  # type: ignore[assignment]
    cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()  # type: ignore[assignment]
    cuda.set_rng_state = lambda state, device="cuda": torch.set_rng_state(state)  # type: ignore[assignment]
    mcore_random._set_cuda_rng_state = _set_rng_state
    mcore_random._get_cuda_rng_state = _get_rng_state
    parallel_state.require_cuda = lambda device: None
    _MODE = _CudaToCpu()
    _MODE.__enter__()


@contextmanager
def suspended() -> Iterator[None]:
    """Leave the device-rewriting ``TorchFunctionMode`` for the block (code that needs no redirection, such as the
    native engine in scripts/performance/engines.py, then runs without its per-operation overhead)."""
    if _MODE is None:
        yield
        return
    _MODE.__exit__(None, None, None)
    try:
        yield
    finally:
        _MODE.__enter__()


def is_installed() -> bool:
    """True once :func:`install` ran in this process."""
    return _MODE is not None
