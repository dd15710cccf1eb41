"""Test-only: ``torch.compile(fn)`` of a plain function sets itself up at the function's first call, not when applied.

megatron-core applies ``torch.compile`` as a decorator to its fusion functions when its modules are imported
(``megatron/core/jit.py``'s ``jit_fuser``, e.g. ``megatron/core/fusions/fused_bias_geglu.py``), which imports
inductor's compiler set-up: 0.9 CPU s per process (measured 2026-12-02 on the 2-core VM, after ``torch._dynamo``,
which ``torch.optim`` imports anyway when the first optimizer is built), although the tests' CPU configurations never
call those functions. The suite starts about 50 processes that import megatron-core.

:func:`install` replaces ``torch.compile`` in this process by a function that, for a plain function (not an
``nn.Module``), returns a wrapper calling ``torch.compile(fn, <same arguments>)`` once, at the first call, and the
compiled function from then on: the same compile with the same options, only later (``torch.compile`` itself only
compiles at the first call). Modules and every other use go to ``torch.compile`` at once. Installed in torchrun workers
by tests/functional_tests/conftest.py and by tests/functional_tests/mcore_cpu/sitecustomize.py, before megatron-core is
imported; never by the library.
"""

import functools
from collections.abc import Callable
from typing import Any


_INSTALLED = False


def install() -> None:
    """Defer ``torch.compile``'s set-up for plain functions in this process (idempotent)."""
    import torch

    global _INSTALLED
    if _INSTALLED:
        return
    original = torch.compile

    def compile_when_called(model: Any = None, **options: Any) -> Any:
        if model is None:  # used as @torch.compile(...): the options now, the function next
            return lambda fn: compile_when_called(fn, **options)
        if isinstance(model, torch.nn.Module) or not callable(model):
            return original(model, **options)
        compiled: list[Callable[..., Any]] = []

        @functools.wraps(model)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not compiled:
                compiled.append(original(model, **options))
            return compiled[0](*args, **kwargs)

        return call

    torch.compile = compile_when_called  # type: ignore[assignment]
    _INSTALLED = True
