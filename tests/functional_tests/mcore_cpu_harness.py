"""Test-only: run megatron-core's CUDA code path on CPU/gloo. Never imported by the library.

megatron-core (0.19) hard-codes CUDA where this library's engine would take a device (the list was found one call at a
time; /work/shared/reference/engine-feasibility.md):

* tensor factories with ``device="cuda"`` or ``device=torch.cuda.current_device()`` (causal and sliding-window
  masks: ``get_default_causal_mask``, ``get_sliding_window_causal_mask``; grad-norm buffers, gradient buckets, TP
  all-gather outputs), ``Tensor.cuda()`` and ``.to("cuda")``;
* ``torch.cuda.current_device()`` used as a device (custom autograd Functions allocate with it in backward);
* the model-parallel RNG tracker: ``torch.cuda.manual_seed`` / ``get_rng_state`` and megatron-core's
  ``_get_cuda_rng_state`` / ``_set_cuda_rng_state``;
* CUDA streams and events (DDP's communication stream), ``torch.cuda.synchronize`` / ``empty_cache``;
* ``Tensor.type() == "torch.cuda.FloatTensor"`` asserted by gradient clipping;
* the MoE all-to-all token dispatcher's split sizes: it moves them from the GPU to host numpy arrays with
  ``maybe_move_tensor_to_cpu``, which leaves a tensor already on the CPU as it is, and torch's ``all_to_all_single``
  takes an array but not a tensor: the dispatcher's copy of that function makes the array on the CPU too.

:func:`install` redirects all of them to the CPU: a process-wide :class:`torch.overrides.TorchFunctionMode` rewrites
every CUDA ``device`` argument to ``"cpu"`` (factories, ``.to``, ``.cuda``) and answers ``Tensor.type()`` of a CPU
tensor with its CUDA name; ``torch.cuda.current_device`` returns ``"cpu"``; the RNG calls use the CPU generator;
streams and events come from the Megatron FSDP harness (no-ops; everything runs in program order). It also disables
the engine's CUDA guard (:func:`megatron_bridge.engines.megatron_core.parallel_state.require_cuda`). Numbers are
megatron-core's
own: nothing in its arithmetic is replaced, except that bf16/fp16 matrix products accumulate in fp32 through torch's
fp32 kernel, as cuBLAS does (:class:`_CudaToCpu` says why).

:func:`install_fsdp` adds what megatron-core's FSDP wrappers need (megatron-fsdp's redirections for megatron-core's
vendored copy, device meshes on the CPU; tests/functional_tests/mcore/test_wrappers.py).

``sitecustomize`` in ``tests/functional_tests/mcore_cpu/`` installs it in subprocesses (torchrun workers of
``run_recipe.py``) when ``MEGATRON_BRIDGE_MCORE_CPU_HARNESS=1``.
"""

from collections.abc import Iterator, Sequence
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


_PRODUCTS = frozenset({torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.Tensor.bmm,
                       torch.baddbmm, torch.Tensor.baddbmm})
"""Matrix products computed in fp32 when their operands are bf16/fp16 CPU tensors (:class:`_CudaToCpu` says why)."""
_REDUCED = (torch.bfloat16, torch.float16)


def _reduced_on_cpu(args: tuple) -> bool:
    """True if every tensor operand is a CPU bf16/fp16 tensor of one dtype (and there are at least two)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return len(tensors) >= 2 and tensors[0].dtype in _REDUCED and all(
        t.dtype == tensors[0].dtype and t.device.type == "cpu" for t in tensors)


class _CudaToCpu(TorchFunctionMode):
    """Every CUDA device argument becomes the CPU; ``Tensor.type()`` of a CPU tensor reads as its CUDA type.

    A bf16/fp16 matrix product (``matmul``, ``bmm``, ``baddbmm``: megatron-core's linear layers and attention) is
    computed as cuBLAS computes it on the GPU, fp32 accumulation of the exact products of the bf16/fp16 inputs rounded
    once, through torch's fp32 CPU kernel. torch's own bf16 kernel does the same arithmetic (fp32 accumulation) but, on
    a CPU without AVX512-BF16, 7-40x slower than fp32 depending on the operands' layout (measured 2026-12-03 on the
    2-core AVX2 VM, 1024x512 @ 512x128, one thread: fp32 2.5 ms; bf16 17 ms for ``x @ w.t()``, 100 ms for ``g @ w``).
    Only the summation order differs, as between any two GEMM kernels: the two agree bit for bit on 99.98 % of the
    outputs of those products in bf16 and 99.7 % in fp16, with the same mean error against an fp64 product.
    """

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in _PRODUCTS and _reduced_on_cpu(args) and "out" not in (kwargs or {}):
            dtype = args[0].dtype
            return func(*(a.float() if isinstance(a, torch.Tensor) else a for a in args), **(kwargs or {})).to(dtype)
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs and args[0].device.type == "cpu":
            return _TYPE_NAMES.get(args[0].dtype, func(*args))
        if kwargs:
            if _is_cuda(kwargs.get("device")):
                kwargs = {**kwargs, "device": "cpu"}
        else:
            kwargs = {}
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


def _to_host(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    """megatron-core's ``maybe_move_tensor_to_cpu`` as it behaves on the GPU: a tensor (here already on the CPU)
    becomes a host tensor, or a numpy array with ``as_numpy``."""
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.detach().cpu().numpy()
    return tensor


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
    from megatron.core.transformer.moe import token_dispatcher

    from megatron_bridge.engines.megatron_core import parallel_state

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
    token_dispatcher.maybe_move_tensor_to_cpu = _to_host
    mcore_random._set_cuda_rng_state = _set_rng_state
    mcore_random._get_cuda_rng_state = _get_rng_state
    parallel_state.require_cuda = lambda device: None
    _products_in_fp32_in_backward()
    _MODE = _CudaToCpu()
    _MODE.__enter__()


def _products_in_fp32_in_backward() -> None:
    """Run megatron-core's linear layers' backward under the mode too: a training step's backward pass runs inside
    the mode's handler of ``loss.backward()``, where torch has left the mode, so its bf16/fp16 products (input and
    weight gradients, two thirds of a layer's) would otherwise take torch's slow reduced-precision CPU kernel."""
    from megatron.core.tensor_parallel.layers import LinearWithGradAccumulationAndAsyncCommunication as Linear

    backward = Linear.backward

    def backward_in_mode(ctx: Any, *grads: Any) -> Any:
        with _CudaToCpu():
            return backward(ctx, *grads)

    Linear.backward = staticmethod(backward_in_mode)  # type: ignore[method-assign,assignment]


class _CpuDevice(str):
    """``torch.cuda.current_device()`` under the FSDP redirections: the string ``"cpu"`` (so it allocates on the CPU
    where it is passed as a device, also outside the function mode) that formats as ``"0"``, because megatron-fsdp
    builds ``torch.device(f"cuda:{torch.cuda.current_device()}")`` (its device check; the mode then maps ``cuda:0``
    to the CPU)."""

    def __format__(self, spec: str) -> str:
        return format(0, spec)


_FSDP_INSTALLED = False


def install_fsdp() -> None:
    """:func:`install`, plus what megatron-core's FSDP wrappers need on CPU (idempotent):

    * the Megatron FSDP harness's synchronous collectives, completed work handles, no-op coalescing manager and
      PREMUL_SUM-free gradient pre-scaling (tests/functional_tests/megatron_fsdp_cpu_harness.py explains why gloo
      needs them), applied to megatron-core's vendored copy of megatron-fsdp
      (``megatron.core.distributed.fsdp.src.megatron_fsdp``), which the adapter imports instead of the
      ``megatron_fsdp`` package;
    * ``torch.cuda.current_device()`` returns :class:`_CpuDevice` (megatron-fsdp formats it into a device string);
    * ``DeviceMesh.from_group(..., "cuda")`` builds a CPU mesh: the Megatron FSDP adapter and
      ``TorchFullyShardedDataParallel`` hard-code ``device_type="cuda"`` for the meshes over megatron-core's groups.
    """
    global _FSDP_INSTALLED
    install()
    if _FSDP_INSTALLED:
        return
    import megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer as vendored_pgb
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from tests.functional_tests import megatron_fsdp_cpu_harness as mfsdp_harness

    if not mfsdp_harness.is_installed():  # else its collectives are synchronous already
        for name, out_arg in (("all_reduce", 0), ("all_gather_into_tensor", None), ("reduce_scatter_tensor", 0),
                              ("all_gather", None), ("broadcast", None)):
            setattr(dist, name, mfsdp_harness._synchronous(name, out_arg))
    vendored_pgb._coalescing_manager = mfsdp_harness._coalescing_manager
    vendored_pgb.gradient_reduce_preprocessing = mfsdp_harness._gradient_reduce_preprocessing
    torch.cuda.current_device = lambda: _CpuDevice("cpu")  # type: ignore[assignment,return-value]
    from_group = DeviceMesh.from_group

    def cpu_from_group(group: Any, device_type: str, *args: Any, **kwargs: Any) -> DeviceMesh:
        return from_group(group, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    DeviceMesh.from_group = staticmethod(cpu_from_group)  # type: ignore[method-assign,assignment]
    _FSDP_INSTALLED = True


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


def pretrain_in_launch(cfg: Any, callbacks: Sequence[Any] = (), forward_step: Any = None) -> Any:
    """Worker: ``pretrain(cfg)`` on the launch's default gloo group (joined by the first run, kept for the launch's
    next test), sharing megatron-core's parallel state with the previous run when it has ``cfg.model``'s layout
    (TP, PP, CP, VP); returns pretrain()'s result.

    Each ``pretrain()`` on a kept default group creates megatron-core's groups (≈ 20 per rank) unless they exist with
    its layout, and ``destroy_model_parallel`` forgets them without destroying them: each gloo group's thread then
    wakes every 10 ms until the launch ends (launcher.py's ``LaunchGroups``). Runs of one layout therefore share one
    set (the library's second ``initialize`` with the same sizes is a no-op:
    ``megatron_bridge.engines.megatron_core.parallel_state.initialize``); another layout, or a failed run, destroys
    it."""
    import torch.distributed as dist

    from megatron_bridge.engines.megatron_core import parallel_state
    from megatron_bridge.training.pretrain import pretrain

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    if parallel_state.current_layout() not in (None, parallel_state.layout(cfg)):
        parallel_state.destroy()
    try:
        return pretrain(cfg, *([forward_step] if forward_step is not None else []), callbacks=list(callbacks))
    except BaseException:
        parallel_state.destroy()
        raise


def workers_env(mode: str = "1") -> dict[str, str]:
    """Environment (to add to ``os.environ``) under which a script under test (``run_recipe.py --nproc N``) starts its
    torchrun workers with the harness installed: ``mode`` ``"1"`` (:func:`install`) or ``"fsdp"``
    (:func:`install_fsdp`), read by ``tests/functional_tests/mcore_cpu/sitecustomize.py``.

    With a fork server (launcher.py's ``forked_workers_env``) the workers fork warm and run that file first
    (forkserver.py's ``STARTUP_ENV``); without one they start cold with its folder on ``PYTHONPATH``, where the
    interpreter imports it. The script and its torchrun agent start cold either way, as users run them, and the file
    does nothing in them (no ``LOCAL_RANK``)."""
    import os

    from tests.functional_tests import forkserver
    from tests.functional_tests.launcher import REPO_ROOT, forked_workers_env

    folder = REPO_ROOT / "tests" / "functional_tests" / "mcore_cpu"
    env = {ENV_FLAG: mode, "OMP_NUM_THREADS": "1"}
    forked = forked_workers_env()
    if forked:
        return {**env, **forked, forkserver.STARTUP_ENV: str(folder / "sitecustomize.py")}
    path = os.pathsep.join(p for p in (str(folder), str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**env, "PYTHONPATH": path}
