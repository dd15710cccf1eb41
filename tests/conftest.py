"""Suite-wide settings: no GPU tests without CUDA, one thread per process (2-core machines), and under pytest-xdist
(``make test`` runs ``pytest tests -n 3 --dist loadgroup``) the functional tests in one serial stream per xdist worker,
balanced by their measured time; a crashed worker fails its test without hanging the run (xdist_recovery.py), and a
session past its time limit ends itself, naming what still ran (session_watchdog.py)."""

import os
from pathlib import Path
from typing import Any

import pytest

from tests.functional_tests.launcher import SHARED_LAUNCHES


pytest_plugins = ["tests.session_watchdog"]


os.environ.setdefault("OMP_NUM_THREADS", "1")
# torch.compile's inductor compiles its C++ kernels in a pool of worker interpreters, one per core by default: each
# imports torch again, and on 2 cores shared by three xdist workers they only contend (test_fsdp2_compile.py alone,
# 2026-12-03: 54 -> 42 CPU s). The generated code does not depend on it.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

FUNCTIONAL_PREFIX = "tests/functional_tests/"
FUNCTIONAL_GROUP = "functional"
"""Prefix of the units of work of the tests under :data:`FUNCTIONAL_PREFIX` (``--dist loadgroup``): ``functional-0``,
``functional-1``, ..."""

FUNCTIONAL_S: dict[str, float] = {
    "checkpoint/test_any_to_any.py": 20,
    "checkpoint/test_resume_pretrain.py": 20,  # not among the 60 slowest items: at most ~20 s
    "context_parallel/test_cp_attention.py": 11,  # not among the 60 slowest items: at most ~20 s
    "families/test_family_layouts.py": 155,
    "families/test_deepseek_v3_layouts.py": 31,
    "families/test_deepseek_v3_mtp.py": 13,
    "families/test_gpt_oss_layouts.py": 59,
    "families/test_gemma2_layouts.py": 27,
    "context_parallel/test_cp_pretrain.py": 49,
    "distributed/test_ddp_two_ranks.py": 90,
    "distributed/test_fsdp2_two_ranks.py": 0,  # the four files in test_ddp_two_ranks.py's shared launch: counted there
    "precision/test_fp8_torchao.py": 0,
    "optimization/test_qat.py": 0,
    "optimization/test_distillation.py": 0,
    "distributed/test_tensor_parallel_functional.py": 45,
    "mcore/test_checkpoint.py": 52,
    "mcore/test_pipeline.py": 31,
    "mcore/test_precision.py": 9,
    "mcore/test_wrappers.py": 91,
    "moe/test_expert_parallel.py": 148,
    "moe/test_megatron_fsdp_moe.py": 66,
    "multinode/test_restart.py": 52,
    "multinode/test_two_nodes.py": 117,  # -20 s: 30 s rendezvous timeouts in the --nnodes cases
    "optimization/test_qat_export.py": 20,  # not among the 60 slowest items: at most ~20 s
    "perf/test_launch.py": 23,
    "perf/test_mcore_memory_estimate.py": 20,  # not among the 60 slowest items: at most ~20 s
    "robustness/test_fail_fast.py": 28,
    "robustness/test_no_orphans.py": 45,
    "slurm/test_slurm_launch.py": 171,
    "training/test_megatron_core_engine.py": 138,
    "training/test_megatron_fsdp.py": 56,
    "training/test_pipeline_parallel.py": 62,
    "training/test_pipeline_tied_embeddings.py": 34,
    "training/test_pretrain_backends.py": 35,
    "training/test_pretrain_single.py": 13,  # not among the 60 slowest items: at most ~20 s
    "context_parallel/test_cp_ring_cuda.py": 0,  # needs CUDA: skipped on CPU
    "distributed/test_backends_cuda.py": 0,  # needs CUDA: skipped on CPU
}
"""Measured seconds of the functional test files in their stream (wall time of the file's tests in the xdist worker,
``make test``'s three workers, a fresh clone on the idle 2-core VM 2026-12-08, ``--durations=60``: setup, call and
teardown of its items among the 60 slowest; launches forked warm: forkserver.py), the weights
that balance the streams (:func:`functional_streams`): a stream's length is what decides when the suite ends. A file
not listed counts :data:`UNMEASURED_S`. The multinode and Slurm files mostly wait (rendezvous, restarts, daemons): the
other streams use the cores meanwhile."""
UNMEASURED_S = 30.0
SAME_STREAM: list[tuple[str, ...]] = [
    # one cached reference (training/_common.py cached_reference: same config, one run per xdist worker)
    ("training/test_pretrain_backends.py", "training/test_megatron_fsdp.py"),
    # the files of each launch shared across files (one launch per pytest process)
    *(tuple(f.removeprefix(FUNCTIONAL_PREFIX) for f in shared.files) for shared in SHARED_LAUNCHES),
]
"""Files that must run in one stream (one process): they share a session cache or a launch."""


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n N``) with functional tests asked for, the controlling process starts the fork server
    that all its workers' launches fork from (launcher.py's ``share_fork_server``), before it starts the workers: one
    server's imports instead of one per worker; the workers fork from it too (``fork_xdist_workers``)."""
    workers = config.getoption("numprocesses", None)
    if not hasattr(config, "workerinput") and isinstance(workers, int) and workers > 0 and _asks_functional(config):
        from tests.functional_tests.launcher import fork_xdist_workers, share_fork_server

        share_fork_server()
        fork_xdist_workers(config)


def _asks_functional(config: pytest.Config) -> bool:
    """Whether the command line's paths include functional tests (``tests``, ``tests/functional_tests/...``)."""
    functional = Path(__file__).resolve().parent / FUNCTIONAL_PREFIX.removeprefix("tests/")
    for arg in config.args or ["."]:
        path = (Path(config.invocation_params.dir) / arg.split("::", 1)[0]).resolve()
        if path == functional or functional in path.parents or path in functional.parents:
            return True
    return False


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
    stream with the least load so far (longest-processing-time first, by :data:`FUNCTIONAL_S`)."""
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
    for unit in sorted(units, key=lambda u: (-sum(FUNCTIONAL_S.get(short[f], UNMEASURED_S) for f in u),
                                             min(u))):
        lightest = load.index(min(load))
        for f in sorted(unit):
            stream_of[f] = lightest
            load[lightest] += FUNCTIONAL_S.get(short[f], UNMEASURED_S)
    return stream_of


def _xdist_scheduler() -> type:
    from tests.xdist_recovery import crash_safe_scope_scheduling

    class FunctionalStreams(crash_safe_scope_scheduling()):
        """xdist scheduling of ``--dist loadgroup`` here: the functional tests split into one unit of work per xdist
        worker (:func:`functional_streams`), so each worker first runs its stream, a test at a time in the order
        collected (a file's tests share its module fixtures and torchrun launches; the streams share the two cores and
        fill each other's waits on launches and daemons), then the unit tests, a file at a time. A worker that
        crashes fails its test and the run goes on to its end (tests/xdist_recovery.py).

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
