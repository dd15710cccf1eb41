"""Run a functional test under ``torch.distributed.run`` from plain pytest.

Pattern (see tests/functional_tests/training/test_pretrain_backends.py)::

    def test_something():
        if not is_worker():
            launch(f"{__file__}::test_something", nproc=2)
            return
        ...  # runs on every rank under torchrun, with the process group set up by the code under test

Several tests that use the same number of processes can share one launch (:class:`LaunchGroups`): every worker runs
them in order, each stays a test of its own on both sides (reported per rank by conftest.py, passed or failed on its
own in the launching process), and the process start-up, imports and rendezvous are paid once per group.

The agent and the workers of a launch are forked from a fork server that this pytest process starts at its first
launch and that has torch, pytest, megatron-core and the library imported already (forkserver.py: each launch still
runs ``torch.distributed.run``, which starts and watches one process per rank; a rank's process runs ``pytest`` as
``python -m pytest`` would). ``MB_COLD_START=1`` starts every process cold instead.

Under torchrun, tests/functional_tests/conftest.py tears the process group down after each test and ends each worker
with ``os._exit`` after pytest printed its summary: torch 2.13's gloo aborts at interpreter teardown in ~10% of runs
otherwise. Every launch has a timeout, cut to end :data:`DEADLINE_MARGIN_S` before the calling test's pytest-timeout
(so the launcher, not pytest-timeout, reports a hung launch: test by test, with the output tail), and its own free
port (``--standalone``: torchrun's agent binds port 0, so parallel sessions cannot race for a port).
"""

import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from megatron_bridge.utils.atomic import pid_alive
from tests.functional_tests import forkserver


REPO_ROOT = Path(__file__).resolve().parents[2]


def is_worker() -> bool:
    """True inside a process started by torch.distributed.run."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_WORLD_SIZE" in os.environ


DEADLINE_MARGIN_S = 30.0
"""A launch ends this long before the calling test's pytest-timeout would stop it (see :func:`set_test_deadline`)."""
_DEADLINE: list[float] = []


def set_test_deadline(timeout_s: float | None) -> None:
    """Called by conftest.py as each test starts in the launching process, with its pytest-timeout (None: none)."""
    _DEADLINE[:] = [] if not timeout_s else [time.monotonic() + timeout_s - DEADLINE_MARGIN_S]


def launch_timeout(timeout: float) -> float:
    """``timeout``, cut to what is left before the running test's deadline (at least 1 s)."""
    return max(1.0, min(timeout, _DEADLINE[0] - time.monotonic())) if _DEADLINE else timeout


LAUNCH_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
"""What every launch (and the fork server) adds to this process's environment."""
_FORK_SERVER: list[tuple[subprocess.Popen, str]] = []


def fork_server_env() -> dict[str, str]:
    """The environment that makes a launch's processes fork from this pytest process's fork server (forkserver.py),
    started at the first call, or from the one a parent pytest process started for its xdist workers
    (:func:`share_fork_server`); empty (cold starts) with ``$MB_COLD_START=1`` or when the server has exited."""
    if os.environ.get(forkserver.COLD_ENV) == "1":
        return {}
    shared = os.environ.get(SHARED_SERVER_ENV, "").rsplit(":", 1)
    if not _FORK_SERVER and len(shared) == 2 and shared[1].isdigit():
        return {forkserver.SOCKET_ENV: shared[0], forkserver.PID_ENV: shared[1]} if pid_alive(int(shared[1])) else {}
    if not _FORK_SERVER:
        folder = Path(tempfile.mkdtemp(prefix="mb-forkserver-"))
        path = str(folder / "socket")
        with open(os.environ.get(forkserver.LOG_ENV) or folder / "server.log", "a") as log:
            proc = subprocess.Popen([sys.executable, "-m", "tests.functional_tests.forkserver", "--serve", path],
                                    cwd=REPO_ROOT, env={**os.environ, **LAUNCH_ENV}, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        atexit.register(_stop_fork_server, proc, folder)
        _FORK_SERVER.append((proc, path))
    proc, path = _FORK_SERVER[0]
    return {forkserver.SOCKET_ENV: path, forkserver.PID_ENV: str(proc.pid)} if proc.poll() is None else {}


SHARED_SERVER_ENV = "MB_SHARED_FORKSERVER"
"""``SOCKET:PID`` of the fork server a parent pytest process shares with the processes it starts
(:func:`share_fork_server`)."""


def share_fork_server() -> None:
    """Start this process's fork server now and name it in this process's environment (:data:`SHARED_SERVER_ENV`), so
    that the processes it starts afterwards (pytest-xdist's workers: conftest.py) fork their launches from it instead
    of each importing torch, megatron-core and the library into a server of its own (≈ 8 CPU s each on the 2-core
    VM)."""
    env = fork_server_env()
    if env:
        os.environ[SHARED_SERVER_ENV] = f"{env[forkserver.SOCKET_ENV]}:{env[forkserver.PID_ENV]}"


def fork_xdist_workers(config: pytest.Config) -> None:
    """Make pytest-xdist start its workers (``-n N``) forked from the shared fork server (:func:`share_fork_server`)
    instead of cold: execnet starts each as ``PYTHON -u -c BOOTSTRAP``, and with :data:`FORKED_PYTHON` as ``PYTHON``
    that runs in a process forked warm (forkserver.py), saving each worker its imports of torch, megatron-core,
    transformers and modelopt before it collects (≈ 11 CPU s each on the 2-core VM). The server's streams are
    unbuffered, so this process's environment asks for that too (``-u`` does the same in a cold worker); a worker that
    cannot fork starts cold. Only for plain ``-n N`` (``--tx`` specs of one's own are left as they are)."""
    env = fork_server_env()
    tx = config.getoption("tx", None) or []
    if not env or not tx or any(spec != "popen" for spec in tx) or " " in f"{FORKED_PYTHON}{sys.executable}":
        return
    unbuffered = {"PYTHONUNBUFFERED": LAUNCH_ENV["PYTHONUNBUFFERED"]}
    os.environ.update({**env, forkserver.PYTHON_ENV: sys.executable, **unbuffered})
    config.option.tx = [f"popen//python={FORKED_PYTHON}"] * len(tx)


FORKED_PYTHON = Path(__file__).with_name("forked_python")
"""The workers' interpreter in :func:`forked_workers_env` (a shell script that runs forkserver.py's client)."""


def forked_workers_env() -> dict[str, str]:
    """The environment that makes a script under test (``launch.py``, ``python -m megatron_bridge.launcher.torchrun``)
    start its torchrun workers forked from this pytest process's fork server: ``PYTHON_EXEC``, torch.distributed.run's
    interpreter for the workers, is :data:`FORKED_PYTHON`. The script and its torchrun agent still start cold, as
    users run them. Empty (cold workers) when :func:`fork_server_env` is."""
    env = fork_server_env()
    return {**env, "PYTHON_EXEC": str(FORKED_PYTHON), forkserver.PYTHON_ENV: sys.executable} if env else {}


def warm_python() -> tuple[str, dict[str, str]]:
    """The interpreter and environment to run a script under test whose subject is what it writes, not its start-up
    or process tree (the docs' commands, ``export_quantized.py``, ``gpu_check.py --dry-run``): when the suite shares a
    fork server (tests/conftest.py, with the functional tests), :data:`FORKED_PYTHON`, a process forked from it that
    runs the file as ``python FILE`` would, without the cold imports of torch and the library; else this interpreter.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    forked = forked_workers_env() if os.environ.get(SHARED_SERVER_ENV) else {}
    return (str(FORKED_PYTHON), {**env, **forked}) if forked else (sys.executable, env)


def _stop_fork_server(proc: subprocess.Popen, folder: Path) -> None:
    proc.kill()
    proc.wait()
    shutil.rmtree(folder, ignore_errors=True)


def _torchrun_pytest(nodeids: list[str], nproc: int, timeout: float, env: dict[str, str] | None,
                     stop_at_first_failure: bool) -> subprocess.CompletedProcess[str]:
    """Run pytest on ``nodeids`` under torch.distributed.run; raises subprocess.TimeoutExpired (``timeout`` already
    cut by :func:`launch_timeout`)."""
    warm = ["-m", "tests.functional_tests.forkserver"]  # forkserver.py: the agent and workers forked warm
    cmd = [  # --standalone: the agent's store binds a free port itself (a port chosen here could be taken first)
        sys.executable, *warm, "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        *warm, "pytest", *nodeids, "-q", "-s", "-p", "no:cacheprovider", *(["-x"] if stop_at_first_failure else []),
    ]
    full_env = {**os.environ, **LAUNCH_ENV, **fork_server_env(), **(env or {})}
    with subprocess.Popen(cmd, cwd=REPO_ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _stop(proc: subprocess.Popen) -> None:
    """End a launch that timed out: SIGTERM to torchrun's agent, which stops its workers (each in a session of its own,
    out of reach of a signal to the agent's group) and SIGKILLs them after 30 s; SIGKILL to the agent after 40 s."""
    proc.terminate()
    try:
        proc.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def _text(stream: str | bytes | None) -> str:
    return stream.decode(errors="replace") if isinstance(stream, bytes) else (stream or "")


_FATAL = re.compile(r"^.*Fatal Python error: .*$", re.M)
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ ")
FATAL_FRAMES = 12
"""Frames kept per thread of a crash report that :func:`fatal_errors` quotes (the innermost; the crashed thread's
stack is quoted whole)."""


def _thread_stacks(lines: list[str]) -> list[tuple[str, list[str]]]:
    """The (header, frames) of each thread of a crash report's ``lines`` (those after ``Fatal Python error``), up to
    the report's end: ``Extension modules:`` or the first line that is no part of it."""
    stacks: list[tuple[str, list[str]]] = []
    for line in lines:
        if _THREAD.match(line):
            stacks.append((line, []))
        elif line.startswith("  ") and stacks:
            stacks[-1][1].append(line)
        elif line.strip() and not line.startswith("Python runtime state"):
            break
    return stacks


_CPP_STACK = re.compile(r"^(SIG[A-Z]+\(\d+\), PID: \d+, Thread \d+:)\s*\n((?:[ \t]*(?:frame #|<omitting).*\n?)*)", re.M)
CPP_FRAMES = 40
"""C++ frames of the crashed thread that :func:`fatal_errors` quotes."""


def _cpp_crash_stacks(output: str) -> list[str]:
    """The C++ stacks of the threads that crashed, from torch's fatal-signal handler (its output marks every thread
    with ``SIGSEGV(11), PID: ..., Thread ...:``; the crashed thread's stack holds the handler itself)."""
    stacks = []
    for match in _CPP_STACK.finditer(output):
        frames = [line.strip() for line in match.group(2).splitlines() if line.strip()]
        if any("fatalSignalHandler(int" in frame for frame in frames):
            stacks.append("\n".join([f"{match.group(1)} (C++, the crashed thread)", *frames[:CPP_FRAMES]]))
    return stacks


def fatal_errors(output: str, limit: int = 6000) -> str:
    """The crash reports (Python's faulthandler: ``Fatal Python error`` and each thread's stack, the crashed one marked
    ``Current thread``) in a launch's ``output``, the crashed thread first, with a heading; "" when there are none.

    A rank that crashes (SIGSEGV, SIGABRT) prints its report long before torchrun's failure summary, which would push it
    out of the output tail a failed test quotes; the report says where the crash happened. The crashed thread's C++
    stack comes first when torch printed it (conftest.py turns that on in the workers)."""
    reports = []
    for match in _FATAL.finditer(output):
        stacks = _thread_stacks(output[match.end():].splitlines()[1:])
        quoted = [match.group(0).strip()]
        for header, frames in sorted(stacks, key=lambda stack: not stack[0].startswith("Current thread")):
            keep = frames if header.startswith("Current thread") else frames[:FATAL_FRAMES]
            more = [f"  ... {len(frames) - len(keep)} outer frames"] if len(keep) < len(frames) else []
            quoted += [header, *keep, *more]
        reports.append("\n".join(quoted))
    reports = _cpp_crash_stacks(output) + reports
    if not reports:
        return ""
    text = "\n\n".join(reports)
    return f"crash report(s) in the output (the crashed thread first):\n{text[:limit]}\n\n"


def launch(nodeid: str, *, nproc: int = 2, timeout: float = 420, env: dict[str, str] | None = None) -> str:
    """Run pytest ``nodeid`` on ``nproc`` ranks; fail the calling test with the output tail unless all pass."""
    timeout = launch_timeout(timeout)
    try:
        proc = _torchrun_pytest([nodeid], nproc, timeout, env, stop_at_first_failure=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{nodeid} on {nproc} ranks timed out after {timeout:.0f}s\n{_text(exc.stdout)[-6000:]}")
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"{nodeid} on {nproc} ranks failed (exit {proc.returncode}):\n{fatal_errors(output)}"
                    f"{output[-8000:]}")
    if " passed" not in output:
        pytest.fail(f"{nodeid} on {nproc} ranks ran no test:\n{output[-4000:]}")
    return output


# ------------------------------------------------------------------------------------ several tests in one launch
REPORT_ENV = "MB_CASE_REPORT"
"""Folder where conftest.py's worker hook appends each test's outcome, one JSON line per phase, per rank."""


@dataclass(frozen=True)
class CaseOutcome:
    """One test of a shared launch, over all ranks."""

    status: str
    """"passed" (every phase on every rank), "failed", "skipped" or "not run" (the launch ended before it)."""
    detail: str = ""
    """What failed, on which rank; or why it did not run, with the output tail."""


def _read_reports(folder: Path, nproc: int) -> dict[int, list[dict[str, str]]]:
    reports: dict[int, list[dict[str, str]]] = {}
    for rank in range(nproc):
        path = folder / f"rank{rank}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        reports[rank] = [json.loads(line) for line in lines if line.strip()]
    return reports


def nodeid_of(file: str, name: str) -> str:
    """pytest's node id of test ``name`` (``test``, ``Class::test``, ``test[id]``) of ``file``, as a worker reports it
    (relative to the repository root)."""
    return f"{Path(file).resolve().relative_to(REPO_ROOT).as_posix()}::{name}"


def _outcome(nodeid: str, reports: dict[int, list[dict[str, str]]], ended: str) -> CaseOutcome:
    failures, skipped, missing, started = [], [], [], []
    for rank, rows in reports.items():
        mine = [r for r in rows if r["nodeid"] == nodeid]
        if not any(r["when"] == "teardown" for r in mine):
            missing.append(rank)
            started += [rank] if mine else []
        failures += [f"rank {rank} ({r['when']}): {r['detail']}" for r in mine if r["outcome"] == "failed"]
        skipped += [r["detail"] for r in mine if r["outcome"] == "skipped"]
    if failures:
        return CaseOutcome("failed", "\n".join(failures))
    if missing:
        during = f" (the launch ended during this test on rank(s) {started})" if started else ""
        return CaseOutcome("not run", f"no result from rank(s) {missing}{during}: {ended}")
    if skipped:
        return CaseOutcome("skipped", skipped[0])
    return CaseOutcome("passed")


def run_cases(nodeids: list[str], *, nproc: int, timeout: float,
              env: dict[str, str] | None = None) -> dict[str, CaseOutcome]:
    """Run the tests ``nodeids`` (of one file or several) in one launch on ``nproc`` ranks, in this order, without
    stopping at a failure; returns each test's outcome over all ranks (conftest.py's worker hook writes them)."""
    timeout = launch_timeout(timeout)
    with tempfile.TemporaryDirectory(prefix="mb-cases-") as folder:
        try:
            proc = _torchrun_pytest([str(REPO_ROOT / n) for n in nodeids], nproc, timeout,
                                    {**(env or {}), REPORT_ENV: folder}, stop_at_first_failure=False)
            output = proc.stdout + proc.stderr
            crashes = fatal_errors(output, 4000) if proc.returncode else ""  # a crashed rank fails the launch
            ended = f"the launch exited with code {proc.returncode}; {crashes}output tail:\n{output[-5000:]}"
        except subprocess.TimeoutExpired as exc:
            ended = f"the launch timed out after {timeout:.0f}s; output tail:\n{_text(exc.stdout)[-6000:]}"
        reports = _read_reports(Path(folder), nproc)
    return {nodeid: _outcome(nodeid, reports, ended) for nodeid in nodeids}


def launch_cases(file: str, names: list[str], *, nproc: int, timeout: float,
                 env: dict[str, str] | None = None) -> dict[str, CaseOutcome]:
    """:func:`run_cases` for the tests ``names`` of ``file``, outcomes by name. A test of a class is named
    ``Class::test``; a parametrized one with its id, ``test[id]``."""
    outcomes = run_cases([nodeid_of(file, n) for n in names], nproc=nproc, timeout=timeout, env=env)
    return {name: outcomes[nodeid_of(file, name)] for name in names}


def _check(outcome: CaseOutcome, where: str) -> None:
    """Skip or fail the calling test as ``outcome`` says."""
    if outcome.status == "skipped":
        pytest.skip(f"{where}: {outcome.detail}")
    if outcome.status != "passed":
        pytest.fail(f"{where} {outcome.status}:\n{outcome.detail[-10000:]}", pytrace=False)


def selected_groups(request: pytest.FixtureRequest, groups: dict[int, list[str]]) -> dict[int, list[str]]:
    """``groups`` (process count -> test names) keeping only the tests this pytest session selected (``-k``, node ids),
    so a launch runs no test the session deselected."""
    selected = {item.name for item in request.session.items}
    return {n: [t for t in names if t.rsplit("::", 1)[-1] in selected] for n, names in groups.items()}


class LaunchGroups:
    """Tests of one file grouped by process count, launched when the first test of a launch asks: one launch per group,
    or a new launch from each test named in ``split_before`` on.

    Args:
        file: the test file (``__file__``).
        groups: process count -> the names of the tests launched together, in the order they run.
        timeout: seconds per launch, per process count.
        env: environment of every launch (e.g. the path of a reference computed by a fixture).
        split_before: tests that start a new launch of their group. megatron-core's groups live until a launch ends
            (``destroy_model_parallel`` forgets them) and each gloo group's thread wakes every 10 ms (gloo's TCP loop),
            so the later tests of a long launch pay for all the earlier ones' groups. Tests keep their order; what one
            leaves on disk (``env``'s folders) a later launch still reads, what it keeps in memory it does not.
    """

    def __init__(self, file: str, groups: dict[int, list[str]], timeout: dict[int, float],
                 env: dict[str, str] | None = None, split_before: tuple[str, ...] = ()) -> None:
        self.file, self.timeout, self.env = file, timeout, env or {}
        self.launches: list[tuple[int, list[str]]] = []
        """(process count, test names) of each launch, in order."""
        for nproc, names in groups.items():
            for name in names:
                if name in split_before or not self.launches or self.launches[-1][0] != nproc:
                    self.launches.append((nproc, []))
                self.launches[-1][1].append(name)
        self._outcomes: dict[int, dict[str, CaseOutcome]] = {}

    def check(self, name: str) -> None:
        """Fail (or skip) the calling test as test ``name`` did on the workers; launches its tests if needed."""
        index = next(i for i, (_, names) in enumerate(self.launches) if name in names)
        nproc, names = self.launches[index]
        if index not in self._outcomes:
            self._outcomes[index] = launch_cases(self.file, names, nproc=nproc, timeout=self.timeout[nproc],
                                                 env=self.env)
        where = f"{name} on {nproc} ranks (one launch with {', '.join(names)})"
        _check(self._outcomes[index][name], where)


# --------------------------------------------------------------------------------- tests of several files, one launch
class SharedLaunch:
    """Tests of several files that need nothing from the launching process (no fixture's path in the environment),
    run in one launch when the first of them (this session selected) asks: each file pays no process start-up,
    imports and rendezvous of its own. Each test stays a test of its own, passed or failed on its own; on the workers
    the tests share one process group (each joins it if none is up: ``dist.is_initialized()``).

    The files of a shared launch run in one xdist stream (tests/conftest.py) and each of its tests gets the launch's
    pytest-timeout (functional conftest.py), as any of them may be the one that starts it.

    Args:
        name: what the launch is, for messages.
        nproc: number of ranks.
        timeout: seconds for the whole launch.
        tests: node ids (relative to the repository root), in the order they run.
    """

    def __init__(self, name: str, nproc: int, timeout: float, tests: list[str]) -> None:
        self.name, self.nproc, self.timeout, self.tests = name, nproc, timeout, tests
        self._outcomes: dict[str, CaseOutcome] | None = None

    @property
    def files(self) -> list[str]:
        """The member files, relative to the repository root."""
        return list(dict.fromkeys(t.split("::", 1)[0] for t in self.tests))

    def check(self, request: pytest.FixtureRequest) -> None:
        """Fail (or skip) the calling test as it did on the workers; launches the shared launch if needed."""
        if self._outcomes is None:
            selected = {item.nodeid for item in request.session.items}
            self._outcomes = run_cases([t for t in self.tests if t in selected], nproc=self.nproc,
                                       timeout=self.timeout)
        nodeid = request.node.nodeid
        _check(self._outcomes[nodeid], f"{nodeid} on {self.nproc} ranks (the shared launch {self.name!r})")


def join_launch_group() -> None:
    """On a worker: join the launch's default process group (gloo) unless an earlier test of the launch did. The tests
    of a :class:`SharedLaunch` start with it, so none of them owns the group (``pretrain()`` and
    ``initialize_distributed`` reuse it and leave it up for the next test)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")


TWO_RANKS = SharedLaunch("two ranks, plain tests", nproc=2, timeout=900, tests=[
    "tests/functional_tests/distributed/test_ddp_two_ranks.py::test_ddp_two_ranks",
    "tests/functional_tests/distributed/test_fsdp2_two_ranks.py::test_fsdp2_two_ranks",
    "tests/functional_tests/precision/test_fp8_torchao.py::test_fp8_fsdp2_ddp_tp_against_bf16",
    "tests/functional_tests/optimization/test_qat.py::test_qat_cpu_formats_train_resume_and_disable",
    "tests/functional_tests/optimization/test_distillation.py::test_student_learns_from_teacher_checkpoint",
])
SHARED_LAUNCHES = [TWO_RANKS]
"""Every shared launch (tests/conftest.py keeps each one's files in one stream).

The megatron-core files keep a launch per file and process count: one launch per process count for the five of them
measured slower, not faster (2026-12-03, 2-core VM: engine, precision, pipeline and checkpoint files 265 s and 419 CPU s
in shared launches vs 246 s and 366 CPU s apart; with mcore/test_wrappers.py too, 558 s vs 357 s). Each test's
megatron-core and DeviceMesh process groups stay alive to the end of a launch (``destroy_model_parallel`` drops them
without destroying them), so a long launch's workers end with ~900 threads and ~1,300 sockets each and its later tests
run slower: test_checkpoint.py's took 96 s alone, 130 s after the three other files, 245 s after test_wrappers.py.
Destroying a finished test's groups between tests (after ``destroy_model_parallel``, then ``gc.collect()``) kept the
workers at ~50 threads but broke test_wrappers.py: megatron-fsdp's DTensor checkpoint code then looked up a
(dp_cp, tp) DeviceMesh group by a name an earlier test's teardown had destroyed. Probable cause: DeviceMesh equality
ignores group names, so DTensor's sharding cache hands back output specs that hold the earlier test's equal mesh. It
is in C++ in this torch, with no clear function; clearing the Python-side cache did not help."""
