"""Test-only: installs the megatron-core CPU harness (tests/functional_tests/mcore_cpu_harness.py) at interpreter
start in processes that have this folder and the repository root on PYTHONPATH and
``MEGATRON_BRIDGE_MCORE_CPU_HARNESS=1`` set, e.g. the torchrun workers of ``scripts/training/run_recipe.py`` in
tests/functional_tests/training/test_megatron_core_engine.py. Never on PYTHONPATH outside these tests.

Only in torchrun workers (``LOCAL_RANK`` set): the launcher and torchrun's agent run no megatron-core code, and
importing it there would cost each of them seconds."""

import os


if os.environ.get("MEGATRON_BRIDGE_MCORE_CPU_HARNESS") == "1" and "LOCAL_RANK" in os.environ:
    from tests.functional_tests.mcore_cpu_harness import install

    install()
