"""Test-only: installs the megatron-core CPU harness (tests/functional_tests/mcore_cpu_harness.py) at interpreter
start in processes that have this folder and the repository root on PYTHONPATH and
``MEGATRON_BRIDGE_MCORE_CPU_HARNESS=1`` set, e.g. the torchrun workers of ``scripts/training/run_recipe.py`` in
tests/functional_tests/training/test_megatron_core_engine.py; with ``MEGATRON_BRIDGE_MCORE_CPU_HARNESS=fsdp`` also
what megatron-core's FSDP wrappers need (``install_fsdp``: megatron-fsdp's redirections, CPU device meshes). Never on
PYTHONPATH outside these tests.

Only in torchrun workers (``LOCAL_RANK`` set): the launcher and torchrun's agent run no megatron-core code, and
importing it there would cost each of them seconds; neither in a worker's multiprocessing resource tracker."""

import os
import sys


_MODE = os.environ.get("MEGATRON_BRIDGE_MCORE_CPU_HARNESS")
_HELPER = "multiprocessing.resource_tracker" in " ".join(sys.orig_argv)
"""A worker's multiprocessing resource tracker inherits its environment but runs no megatron-core code."""
if _MODE in ("1", "fsdp") and "LOCAL_RANK" in os.environ and not _HELPER:
    from tests.functional_tests import deferred_compile

    deferred_compile.install()  # before megatron-core is imported (deferred_compile.py says why)
    from tests.functional_tests.mcore_cpu_harness import install, install_fsdp

    if _MODE == "fsdp":
        install_fsdp()
    else:
        install()
