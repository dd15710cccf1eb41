"""Suite-wide settings: no GPU tests without CUDA, one thread per process (2-core machines), and under pytest-xdist
(``make test`` runs ``pytest tests -n 2 --dist loadgroup``) the functional tests in one serial stream per xdist worker,
balanced by their measured CPU time."""

import os
from typing import Any

import pytest

from tests.functional_tests.launcher import SHARED_LAUNCHES


os.environ.setdefault("OMP_NUM_THREADS", "1")

FUNCTIONAL_PREFIX = "tests/functional_tests/"
FUNCTIONAL_GROUP = "functional"
"""Prefix of the units of work of the tests under :data:`FUNCTIONAL_PREFIX` (``--dist loadgroup``): ``functional-0``,
``functional-1``, ..."""

FUNCTIONAL_CPU_S: dict[str, float] = {
    "checkpoint/test_any_to_any.py": 41,
    "checkpoint/test_resume_pretrain.py": 43,
    "context_parallel/test_cp_attention.py": 19,
    "context_parallel/test_cp_pretrain.py": 154,  # with the two Megatron FSDP x CP tests
    "distributed/test_ddp_two_ranks.py": 125,  # the launch shared with 4 other files (launcher.py's TWO_RANKS)
    "distributed/test_tensor_parallel_functional.py": 39,
    "mcore/test_checkpoint.py": 155,
    "mcore/test_pipeline.py": 134,
    "mcore/test_precision.py": 65,
    "mcore/test_wrappers.py": 262,
    # from the full two-stream run at 30cd899 (per file, same loaded VM)
    "moe/test_expert_parallel.py": 80,
    "multinode/test_restart.py": 101,
    "multinode/test_two_nodes.py": 115,
    "optimization/test_qat_export.py": 15,
    "perf/test_launch.py": 21,
    "perf/test_mcore_memory_estimate.py": 11,
    "robustness/test_fail_fast.py": 35,
    "robustness/test_no_orphans.py": 21,
    "slurm/test_slurm_launch.py": 25,
    "training/test_megatron_core_engine.py": 112,
    "training/test_megatron_fsdp.py": 64,
    "training/test_pipeline_parallel.py": 139,
    "training/test_pretrain_backends.py": 49,
    "training/test_pretrain_single.py": 7,
    "context_parallel/test_cp_ring_cuda.py": 0,  # needs CUDA: skipped on CPU
    "distributed/test_backends_cuda.py": 0,  # needs CUDA: skipped on CPU
}
"""Measured CPU seconds (user+sys of the launching process and all its children, one file at a time, 2026-12-02 on
the loaded 2-core VM) of the functional test files, the weights that balance the streams
(:func:`functional_streams`). A file not listed counts :data:`UNMEASURED_CPU_S`."""
UNMEASURED_CPU_S = 30.0
SAME_STREAM: list[tuple[str, ...]] = [
    # one cached reference (training/_common.py cached_reference: same config, one run per xdist worker)
    ("training/test_pretrain_backends.py", "training/test_megatron_fsdp.py"),
    # the files of each launch shared across files (one launch per pytest process)
    *(tuple(f.removeprefix(FUNCTIONAL_PREFIX) for f in shared.files) for shared in SHARED_LAUNCHES),
]
"""Files that must run in one stream (one process): they share a session cache or a launch."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` when no CUDA device is present."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def functional_streams(files: list[str], n: int) -> dict[str, int]:
    """Each functional test file's stream (0..n-1): the :data:`SAME_STREAM` sets kept whole, the heaviest first onto the
    stream with the least CPU so far (longest-processing-time first, by :data:`FUNCTIONAL_CPU_S`)."""
    short = {f: f.removeprefix(FUNCTIONAL_PREFIX) for f in files}
    units: list[set[str]] = []
    for together in SAME_STREAM:  # overlapping sets merge
        unit = {f for f in files if short[f] in together}
        for other in [u for u in units if u & unit]:
            units.remove(other)
            unit |= other
        if unit:
            units.append(unit)
    placed = {f for unit in units for f in unit}
    units += [{f} for f in files if f not in placed]
    load, stream_of = [0.0] * max(1, n), {}
    for unit in sorted(units, key=lambda u: (-sum(FUNCTIONAL_CPU_S.get(short[f], UNMEASURED_CPU_S) for f in u),
                                             min(u))):
        lightest = load.index(min(load))
        for f in sorted(unit):
            stream_of[f] = lightest
            load[lightest] += FUNCTIONAL_CPU_S.get(short[f], UNMEASURED_CPU_S)
    return stream_of


def _xdist_scheduler() -> type:
    from xdist.scheduler import LoadScopeScheduling

    class FunctionalStreams(LoadScopeScheduling):
        """xdist scheduling of ``--dist loadgroup`` here: the functional tests split into one unit of work per xdist
        worker (:func:`functional_streams`), so each worker first runs its stream, a test at a time in the order
        collected (a file's tests share its module fixtures and torchrun launches; two streams use the two cores when
        either waits on a launch's start-up), then the unit tests, a file at a time.

        xdist's own loadgroup reads ``xdist_group`` marks into the node ids, which pytest 9 no longer lets a plugin
        rename: it would split a file's tests over both workers."""

        _stream_of: dict[str, int] = {}

        def schedule(self) -> None:
            if self.collection is None and self.collection_is_completed:
                nodeids = next(iter(self.registered_collections.values()))
                files = list(dict.fromkeys(n.split("::", 1)[0] for n in nodeids if n.startswith(FUNCTIONAL_PREFIX)))
                self._stream_of = functional_streams(files, self.numnodes)
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            if not file.startswith(FUNCTIONAL_PREFIX):
                return file
            return f"{FUNCTIONAL_GROUP}-{self._stream_of.get(file, 0)}"

    return FunctionalStreams


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The functional streams for ``--dist loadgroup`` (``make test``), units in collection order (the functional
    streams, the longest, first); xdist's own for the other modes. (xdist is imported only here: a torchrun worker's
    pytest never schedules.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    config.option.loadscopereorder = False
    return _xdist_scheduler()(config, log)
