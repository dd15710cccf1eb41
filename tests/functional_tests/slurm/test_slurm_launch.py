"""launch.py -a/-p on a real two-node Slurm cluster started by the test (cluster.py): the job's losses equal a local
2-process run's (1e-5 relative), -d prints the script and submits nothing, --detach true returns a job id and a second
submit into that live folder is refused (--status reports it, --follow ends with its state), stop signals (TERM to the
batch shell 1 s into a job, USR1, USR2 and TERM to the step mid-run) each end a job cleanly with a checkpoint where it
stopped (none before the first step) and a new job finishes the run with the uninterrupted losses, a job whose worker
dies is resubmitted and resumes (--max_retries), a node that stops answering is found within --node_timeout and the run
resumes, retries end after --max_retries, a user error (exit 2) is not retried, a partition Slurm does not know is
refused with Slurm's message.

Fast: one module-scoped cluster; the local reference and the training runs start together (``runs``), each test
waits for its own; tiny_llama, 10 steps. Skipped where Slurm is not installed (the reason names the install command).
"""

import calendar
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from megatron_bridge.launcher.slurm_follow import run_jobs
from tests.functional_tests.slurm.cluster import INSTALL_HINT, SPARE_PARTITION, SlurmCluster, missing_programs


REPO = Path(__file__).resolve().parents[3]
LAUNCH = [sys.executable, "scripts/performance/launch.py"]
RUN = ["-mr", "tiny_llama", "-ng", "2", "-ms", "10"]
SLURM = ["-gn", "1", "-a", "ACCOUNT", "-p", "PARTITION", "-t", "00:10:00"]
RTOL = 1e-5
TIMEOUT_S = 400

_missing = missing_programs()
pytestmark = [
    pytest.mark.skipif(bool(_missing), reason=f"Slurm is not installed (missing {_missing}): {INSTALL_HINT}"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the test cluster runs slurmd as root (SlurmUser=root)"),
    pytest.mark.distributed,
    pytest.mark.timeout(TIMEOUT_S + 60),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    c = SlurmCluster(tmp_path_factory.mktemp("slurm"), partition="PARTITION")
    try:
        yield c.start()
    finally:
        c.stop()


@dataclass
class Launch:
    """One launch.py process started by the ``runs`` fixture."""

    proc: subprocess.Popen
    run_dir: Path
    log: Path
    events: list[str] = field(default_factory=list)
    """What a watcher thread did to the job (for the assertions)."""

    def wait(self) -> tuple[int, str]:
        try:
            self.proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"launch.py did not end within {TIMEOUT_S} s:\n{self.output()[-6000:]}")
        return self.proc.returncode, self.output()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def losses(self) -> list[float]:
        return json.loads((self.run_dir / "results.json").read_text())["losses"]


def _env(cluster: SlurmCluster) -> dict[str, str]:
    return {**cluster.env(), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")])}


def _start(cluster: SlurmCluster, root: Path, name: str, argv: list[str]) -> Launch:
    run_dir, log = root / name, root / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*LAUNCH, *argv, "--output_dir", str(run_dir)], cwd=REPO, env=_env(cluster),
                                stdout=out, stderr=subprocess.STDOUT)
    return Launch(proc, run_dir, log)


def _first_job(run_dir: Path, deadline: float) -> str:
    jobs = run_dir / "slurm_jobs.txt"
    while time.monotonic() < deadline:
        if jobs.exists() and jobs.read_text().strip():
            return jobs.read_text().split()[0]
        time.sleep(0.05)
    raise TimeoutError(f"no job id in {jobs}")


def _wait_for(predicate, deadline: float, what: str) -> None:  # noqa: ANN001
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(what)


def _checkpoint_step(run_dir: Path) -> int:
    try:
        return int((run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text())
    except (FileNotFoundError, ValueError):
        return 0


def _nth_job(run_dir: Path, n: int, deadline: float) -> str:
    """The id of the run's n-th job (1: the first; each later one is the one its predecessor resubmitted)."""
    from megatron_bridge.launcher.slurm_follow import successor

    job = _first_job(run_dir, deadline)
    for _ in range(n - 1):
        _wait_for(lambda j=job: successor(run_dir, j) is not None, deadline, f"the job after {job}")
        job = successor(run_dir, job)
    return job


def _signal_jobs(cluster: SlurmCluster, launch: Launch, plan: list[tuple[str, str]]) -> None:
    """Job k of the run gets ``plan[k-1]``: ("early", SIG) 1 s after it starts running, to the batch shell (as
    Slurm's pre-time-limit ``--signal=B:SIG@T`` does); ("mid", SIG) once it logged a step, to its training step
    (``scancel --signal=SIG``, what a user or a site's preemption sends)."""
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for n, (when, sig) in enumerate(plan, start=1):
            job = _nth_job(launch.run_dir, n, deadline)
            if when == "early":
                _wait_for(lambda j=job: cluster.job_state(j) == "RUNNING", deadline, f"job {job} running")
                time.sleep(1.0)
                cluster.run(["scancel", "--batch", f"--signal={sig}", job])
            else:
                log = launch.run_dir / f"slurm-{job}.out"
                _wait_for(lambda lg=log: lg.exists() and " iteration " in lg.read_text(errors="replace"), deadline,
                          f"a step of job {job}")
                cluster.run(["scancel", f"--signal={sig}", job])
            launch.events.append(f"{when} SIG{sig} to job {job}")
    except (TimeoutError, subprocess.SubprocessError) as exc:
        launch.events.append(f"watcher: {exc}")


def _workers(run_dir: Path) -> dict[int, int]:
    """rank -> pid of the training workers of this run (their command names the run folder; torch set RANK)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            env = dict(v.split(b"=", 1) for v in (entry / "environ").read_bytes().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if str(run_dir).encode() in cmd and b"-u" in cmd[:2] and b"RANK" in env:
            found[int(env[b"RANK"])] = int(entry.name)
    return found


def _kill_worker_then_freeze_node(cluster: SlurmCluster, launch: Launch) -> None:
    """Job 1, once the run has a checkpoint (step 2): SIGKILL the rank-1 worker (on node 1). Job 2 (the retry), once
    it saved a checkpoint of its own: node n2 stops answering (:func:`_freeze_node_mid_run`)."""
    deadline = time.monotonic() + TIMEOUT_S
    try:
        _wait_for(lambda: _checkpoint_step(launch.run_dir) >= 2, deadline, "the checkpoint of step 2")
        step, pid = _checkpoint_step(launch.run_dir), _workers(launch.run_dir).get(1)
        if pid is None:
            raise TimeoutError(f"no rank-1 worker found at checkpoint step {step}")
        os.kill(pid, signal.SIGKILL)
        launch.events.append(f"killed rank 1 (pid {pid}) after checkpoint step {step}")
        retry = _nth_job(launch.run_dir, 2, deadline)
        _wait_for(lambda: " iteration " in _log_text(launch.run_dir, retry), deadline, f"a step of job {retry}")
        resumed = _checkpoint_step(launch.run_dir)
    except (TimeoutError, OSError) as exc:
        launch.events.append(f"watcher: {exc}")
        return
    _freeze_node_mid_run(cluster, launch, retry, resumed)


def _log_text(run_dir: Path, job: str) -> str:
    path = run_dir / f"slurm-{job}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def _environ(pid: int) -> dict[bytes, bytes]:
    try:
        return dict(v.split(b"=", 1) for v in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in v)
    except OSError:
        return {}


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                children.setdefault(_parent(int(entry.name)), []).append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _node_task(job: str, node: str) -> int | None:
    """The pid of the job's training task on ``node`` (torch's launcher: SLURMD_NODENAME tells the node)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        env = _environ(int(entry.name))
        try:
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if env.get(b"SLURMD_NODENAME") == node.encode() and env.get(b"SLURM_JOB_ID") == job.encode() \
                and b"megatron_bridge.launcher.torchrun" in cmd:
            return int(entry.name)
    return None


def _job_pids_on(launch: Launch, job: str, node: str, after_step: int, deadline: float) -> list[int]:
    """Once ``job`` saved a checkpoint past ``after_step``: its step daemon on ``node``, its task and workers there."""
    _wait_for(lambda: _checkpoint_step(launch.run_dir) > after_step and _node_task(job, node) is not None, deadline,
              f"a checkpoint of job {job}")
    task = _node_task(job, node)
    if task is None:
        raise TimeoutError(f"no task of job {job} on {node}")
    return [_parent(task), *_descendants(task)]


def _until_retry(launch: Launch, job: str, done: str, wait_s: float) -> None:
    """Record ``done`` (with the checkpoint step and the time), then wait for the run to resubmit itself."""
    from megatron_bridge.launcher.slurm_follow import successor

    launch.events.append(f"{done} after checkpoint step {_checkpoint_step(launch.run_dir)} at {time.time():.0f}")
    _wait_for(lambda: successor(launch.run_dir, job) is not None, time.monotonic() + wait_s, "the retry")
    launch.events.append("retry submitted")


def _freeze_node_mid_run(cluster: SlurmCluster, launch: Launch, job: str, after_step: int) -> None:
    """Once ``job`` saved a checkpoint past ``after_step``: node n2 stops answering for the job (SIGSTOP to the job's
    step daemon there, its task and its workers; n2's slurmd stays up so that the other runs' jobs keep starting);
    resumed once the run resubmitted itself (or after 120 s)."""
    frozen: list[int] = []
    try:
        frozen = _job_pids_on(launch, job, "n2", after_step, time.monotonic() + TIMEOUT_S)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        _until_retry(launch, job, f"froze n2 of job {job}", 120)
    except (TimeoutError, OSError) as exc:
        launch.events.append(f"watcher: {exc}")
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass


def _kill_node_mid_run(cluster: SlurmCluster, launch: Launch) -> None:
    """Job 1 (in the spare partition: n3, n4), once it saved a checkpoint: node n4 dies whole (SIGKILL at once to its
    slurmd, the job's step daemon there, its launcher and worker: a power loss); n4's slurmd starts again (the node
    rebooted) once the run resubmitted itself (or after 150 s). The other runs' jobs never use n3 or n4."""
    deadline, killed = time.monotonic() + TIMEOUT_S, False
    try:
        job = _nth_job(launch.run_dir, 1, deadline)
        for pid in [cluster.pid("slurmd-n4"), *_job_pids_on(launch, job, "n4", 1, deadline)]:
            os.kill(pid, signal.SIGKILL)
        killed = True
        _until_retry(launch, job, f"killed n4 of job {job} whole", 150)
    except (TimeoutError, OSError) as exc:
        launch.events.append(f"watcher: {exc}")
    finally:
        if killed:
            cluster.start_node("n4")


@pytest.fixture(scope="module")
def runs(cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Launch]]:
    """Start together: the local reference, the plain Slurm run, the preempted one and the one whose worker dies."""
    root = tmp_path_factory.mktemp("runs")
    launches = {
        "local": _start(cluster, root, "local", RUN),
        # stop signals: none is a failure (--max_retries 0), each saves where it stopped, a new job resumes
        "early_usr1": _start(cluster, root, "early_usr1", [*RUN, *SLURM, "--detach", "false", "--max_retries", "0"]),
        "usr2_term": _start(cluster, root, "usr2_term", [*RUN, *SLURM, "--detach", "false", "--max_retries", "0"]),
        # a worker killed in job 1, node n2 frozen whole in job 2 (found within --node_timeout): both retried
        "failed": _start(cluster, root, "failed", [*RUN, *SLURM, "--detach", "false", "--max_retries", "2",
                                                   "--node_timeout", "15", "checkpoint.save_interval=2"]),
        # node n4 killed whole in job 1 (slurmd included; the spare partition), found within --node_timeout: one retry
        # finishes the run
        "node_killed": _start(cluster, root, "node_killed", [*RUN, *SLURM, "-p", SPARE_PARTITION, "--detach", "false",
                                                             "--max_retries", "1", "--node_timeout", "15",
                                                             "checkpoint.save_interval=2"]),
        # fails on every node before Python starts: each retry fails the same way
        "exhausted": _start(cluster, root, "exhausted", [*RUN, *SLURM, "--detach", "false", "--max_retries", "1",
                                                         "-ce", "PYTHONHOME=/nonexistent"]),
        # a data file that does not exist: a user error (exit 2) in the job, which a retry would repeat
        "user_error": _start(cluster, root, "user_error", [*RUN, *SLURM, "--detach", "false", "dataset.mock=false",
                                                           "dataset.data_path=[/nonexistent/corpus]"]),
    }
    plans = {"early_usr1": [("early", "TERM"), ("mid", "USR1")], "usr2_term": [("mid", "USR2"), ("mid", "TERM")]}
    watchers = [*(threading.Thread(target=_signal_jobs, args=(cluster, launches[name], plan), daemon=True)
                  for name, plan in plans.items()),
                threading.Thread(target=_kill_worker_then_freeze_node, args=(cluster, launches["failed"]),
                                 daemon=True),
                threading.Thread(target=_kill_node_mid_run, args=(cluster, launches["node_killed"]), daemon=True)]
    for w in watchers:
        w.start()
    yield launches
    for launch in launches.values():
        if launch.proc.poll() is None:
            launch.proc.kill()
            launch.proc.wait()


def _assert_close(losses: list[float], reference: list[float], first_step: int = 1) -> None:
    """``losses`` of steps ``first_step``..10 equal the reference's within RTOL."""
    assert len(reference) == 10 and len(losses) == 11 - first_step
    for step, a in enumerate(losses, start=first_step):
        b = reference[step - 1]
        assert abs(a - b) <= RTOL * abs(b), f"step {step}: {a} vs the local run's {b}"


@pytest.fixture(scope="module")
def reference(runs: dict[str, Launch]) -> list[float]:
    rc, out = runs["local"].wait()
    assert rc == 0, out[-4000:]
    return runs["local"].losses()


def test_two_node_job_matches_local_run(runs: dict[str, Launch], reference: list[float]) -> None:
    """Every job of a run (here three: two stopped by signals, below) is 2 nodes x 1 process with node 0 at the first
    node's NodeAddr; the run's losses equal the local 2-process run's."""
    launch = runs["usr2_term"]
    rc, out = launch.wait()
    assert rc == 0, out[-6000:]
    assert out.count("2 node(s) x 1 process(es), node 0 at 127.0.0.1") == 3, out[-6000:]
    assert "COMPLETED (exit code 0)" in out and out.strip().splitlines()[-1].startswith("results: "), out[-3000:]
    _assert_close(launch.losses(), reference)


def _assert_stops_resume(launch: Launch, plan: list[str], reference: list[float]) -> str:
    """Every job but the last was stopped by its signal (not a failure), saved where it stopped (or had nothing to
    save before its first step), the next one loaded that step, and the run's losses equal the reference's."""
    rc, out = launch.wait()
    assert [e.split(" to job")[0] for e in launch.events] == plan, (launch.events, out[-6000:])
    assert rc == 0, (launch.events, out[-6000:])
    assert "retry" not in out and "Traceback" not in out, out[-6000:]
    assert len(run_jobs(launch.run_dir)) == len(plan) + 1
    for event in plan:
        sig = event.split()[1]
        if event.startswith("early"):
            assert f"stopped by {sig} before a step of this job (exit 0): nothing new to save" in out, out[-6000:]
            continue
        step = re.search(rf"stopped by {sig} at step (\d+) of 10 \(exit 0\), checkpoint saved", out)
        assert step, out[-6000:]
        assert re.search(rf"loaded checkpoint \S+iter_{int(step.group(1)):07d}", out), out[-6000:]
    assert out.count("SUMMARY ") == len(plan) + 1, out[-3000:]  # each job's rank 0; the follower adds none
    results = json.loads((launch.run_dir / "results.json").read_text())
    assert results["first_step"] == 1  # the slices' results.json joined
    _assert_close(results["losses"], reference)
    return out


def test_signal_one_second_into_a_job_then_usr1_mid_run(runs: dict[str, Launch], reference: list[float]) -> None:
    """The pre-time-limit signal 1 s after the job starts (before training) ends the job cleanly and a new one
    resumes; USR1 mid-run (train.exit_signal is SIGTERM) saves at the step reached and a third job finishes."""
    out = _assert_stops_resume(runs["early_usr1"], ["early SIGTERM", "mid SIGUSR1"], reference)
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \[slurm job \d+\] got SIGTERM", out, re.M), out[-6000:]


def test_usr2_then_term_mid_run_save_and_resume(runs: dict[str, Launch], reference: list[float]) -> None:
    _assert_stops_resume(runs["usr2_term"], ["mid SIGUSR2", "mid SIGTERM"], reference)


def test_failed_job_is_resubmitted_and_resumes(runs: dict[str, Launch], reference: list[float]) -> None:
    """A worker killed in job 1: job 2 resumes from the checkpoint (retry 1 of 2)."""
    launch = runs["failed"]
    rc, out = launch.wait()
    assert launch.events and launch.events[0].startswith("killed rank 1"), (launch.events, out[-6000:])
    assert rc == 0, (launch.events, out[-6000:])
    assert "retry 1 of 2" in out and "loaded checkpoint" in out, out[-6000:]
    results = json.loads((launch.run_dir / "results.json").read_text())
    assert results["first_step"] > 2  # the last job started from a checkpoint, not from step 0
    _assert_close(results["losses"], reference, first_step=results["first_step"])


def _assert_node_1_named_in_time(out: str, event: str) -> None:
    """The script named node 1 silent within --node_timeout (15 s) plus its 5 s check, a heartbeat and 1 s of the
    watcher's ``event`` (which ends with the time it broke the node)."""
    lost = re.search(r"^(\S+) \[slurm job \d+\] node 1 stopped answering: no heartbeat for (\d+) s "
                     r"\(--node_timeout 15\)", out, re.M)
    assert lost, out[-6000:]
    broken_at = float(event.split()[-1])
    found_at = calendar.timegm(time.strptime(lost.group(1), "%Y-%m-%dT%H:%M:%SZ"))
    assert found_at - broken_at <= 15 + 5 + 5 + 1, (broken_at, lost.group(0))  # timeout + check + heartbeat + 1 s


def test_a_node_that_stops_answering_is_found_and_the_run_resumes(runs: dict[str, Launch]) -> None:
    """n2 frozen in job 2 (the step daemon, launcher and worker there): the script names node 1 within
    --node_timeout (15 s) plus its 5 s check and a heartbeat, stops the step and resubmits (retry 2 of 2); job 3
    finishes the run (its losses: the test above). Neither Slurm's own node timeout (300 s) nor the cluster's requeue
    setting plays a part."""
    launch = runs["failed"]
    rc, out = launch.wait()
    assert len(launch.events) >= 2 and launch.events[1].startswith("froze n2 of job"), (launch.events, out[-6000:])
    assert rc == 0, (launch.events, out[-6000:])
    _assert_node_1_named_in_time(out, launch.events[1])
    assert re.search(r"failed \(exit \d+, lost node 1\): retry 2 of 2", out), out[-6000:]
    assert len(run_jobs(launch.run_dir)) == 3
    frozen_step = int(launch.events[1].split("checkpoint step ")[1].split()[0])
    assert json.loads((launch.run_dir / "results.json").read_text())["first_step"] > frozen_step  # job 3 resumed


def test_a_node_killed_whole_is_found_and_one_retry_finishes(runs: dict[str, Launch],
                                                              reference: list[float]) -> None:
    """n4 killed whole in job 1 (slurmd, step daemon, launcher, worker): node 0's launcher ends (its worker lost its
    peer) and says so in its last heartbeat, so the script names node 1, the silent one, within --node_timeout plus
    its check and a heartbeat, and resubmits (--max_retries 1, not Slurm's requeue); the retry, on the rebooted n4,
    resumes from the checkpoint and finishes with the local run's losses."""
    launch = runs["node_killed"]
    rc, out = launch.wait()
    assert launch.events and launch.events[0].startswith("killed n4 of job"), (launch.events, out[-6000:])
    assert rc == 0, (launch.events, out[-6000:])
    _assert_node_1_named_in_time(out, launch.events[0])
    assert re.search(r"failed \(exit \d+, lost node 1\): retry 1 of 1", out), out[-6000:]
    assert "requeued by Slurm" not in out
    assert len(run_jobs(launch.run_dir)) == 2
    results = json.loads((launch.run_dir / "results.json").read_text())
    killed_step = int(launch.events[0].split("checkpoint step ")[1].split()[0])
    assert results["first_step"] > 1 and results["first_step"] <= killed_step + 1, results["first_step"]
    _assert_close(results["losses"], reference, results["first_step"])


def test_retries_end_after_max_retries(runs: dict[str, Launch]) -> None:
    launch = runs["exhausted"]
    rc, out = launch.wait()
    assert rc == 1, out[-4000:]
    assert "retry 1 of 1" in out and "failed (exit 1) with all 1 retries used" in out, out[-4000:]
    assert len(run_jobs(launch.run_dir)) == 2  # the first job and one retry
    assert out.strip().splitlines()[-1].endswith("FAILED (exit code 1)")


def test_user_error_is_not_retried(runs: dict[str, Launch]) -> None:
    launch = runs["user_error"]
    rc, out = launch.wait()
    assert rc == 2, out[-4000:]
    assert "/nonexistent/corpus" in out and "not retried" in out, out[-4000:]
    assert len(run_jobs(launch.run_dir)) == 1


def test_dryrun_prints_the_script_and_submits_nothing(cluster: SlurmCluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "dry"
    proc = subprocess.run([*LAUNCH, *RUN, *SLURM, "-d", "--output_dir", str(run_dir)], cwd=REPO, env=_env(cluster),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --account=ACCOUNT",
                 "#SBATCH --partition=PARTITION", "#SBATCH --time=00:10:00", "#SBATCH --signal=B:TERM@60"):
        assert line in proc.stdout
    assert not run_dir.exists()
    assert cluster.run(["squeue", "-h", "-n", "mb-dry"]).stdout.strip() == ""


def test_detach_then_live_folder_refused_status_and_follow(cluster: SlurmCluster, tmp_path: Path) -> None:
    """--detach true returns a job id within seconds; a second submit into the live run folder is refused (exit 2)
    naming that job, with nothing in the folder changed; --status reports it; once it is cancelled, --follow ends
    with its state."""
    run_dir = tmp_path / "detached run"  # a space: the #SBATCH lines quote it
    # held (#SBATCH --hold): it stays pending, live, until cancelled, however long the checks below take
    argv = [*LAUNCH, *RUN, *SLURM, "--additional_slurm_params", "hold", "--output_dir", str(run_dir)]
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=_env(cluster), capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = proc.stdout.split("submitted Slurm job ")[1].split(";")[0]
    try:
        assert cluster.job_state(job) == "PENDING"
        assert (run_dir / "sbatch.sh").exists() and (run_dir / "slurm_jobs.txt").read_text().split() == [job]
        assert elapsed < 30, f"--detach true took {elapsed:.1f} s"  # python start-up and imports under load
        kept = {name: (run_dir / name).read_bytes() for name in ("sbatch.sh", "slurm_jobs.txt")}
        again = subprocess.run(argv, cwd=REPO, env=_env(cluster), capture_output=True, text=True, timeout=120)
        assert again.returncode == 2, again.stderr[-3000:]
        assert f"belongs to Slurm job {job}, which is still pending or running" in again.stderr, again.stderr[-3000:]
        assert {name: (run_dir / name).read_bytes() for name in kept} == kept
        status = subprocess.run([*LAUNCH, "--status", str(run_dir)], cwd=REPO, env=_env(cluster),
                                capture_output=True, text=True, timeout=120)
        assert status.returncode == 0 and f"  job {job}: PENDING (reason: JobHeldUser)" in status.stdout, \
            status.stdout + status.stderr
        assert f"Slurm run {run_dir}: 1 job(s), checkpoint step 0 of 10" in status.stdout, status.stdout
    finally:
        cluster.run(["scancel", job])
        _wait_for(lambda: cluster.job_state(job) not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"),
                  time.monotonic() + 60, f"job {job} to end")
    follow = subprocess.run([*LAUNCH, "--follow", str(run_dir)], cwd=REPO, env=_env(cluster), capture_output=True,
                            text=True, timeout=120)
    assert follow.returncode != 0 and f"Slurm job {job} CANCELLED" in follow.stderr, follow.stderr[-3000:]
    assert len(run_jobs(run_dir)) == 1  # a cancelled run is not resubmitted


def test_two_submits_into_a_new_folder_at_once_make_one_job(cluster: SlurmCluster, tmp_path: Path) -> None:
    """Two launches into the same brand-new run folder, started together: the folder's submit lock lets one submit
    (held, so it stays live) and the other is refused naming that job; one job in Slurm, one in the jobs file."""
    run_dir = tmp_path / "raced"
    argv = [*LAUNCH, *RUN, *SLURM, "--additional_slurm_params", "hold", "--output_dir", str(run_dir)]
    procs = [subprocess.Popen(argv, cwd=REPO, env=_env(cluster), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    jobs = [line.split()[0] for line in cluster.run(["squeue", "-h", "-n", "mb-raced", "-o", "%i"]).stdout.split()]
    try:
        codes = sorted(proc.returncode for proc in procs)
        assert codes == [0, 2], outputs
        (job,) = jobs
        refused = next(err for proc, (_, err) in zip(procs, outputs, strict=True) if proc.returncode == 2)
        assert f"belongs to Slurm job {job}, which is still pending or running" in refused, refused[-3000:]
        assert (run_dir / "slurm_jobs.txt").read_text().split() == [job]
    finally:
        for job in jobs:
            cluster.run(["scancel", job])


def test_unknown_partition_shows_slurms_message(cluster: SlurmCluster, tmp_path: Path) -> None:
    proc = subprocess.run([*LAUNCH, *RUN, *SLURM[:-4], "-p", "nosuchpartition", "--output_dir", str(tmp_path / "p")],
                          cwd=REPO, env=_env(cluster), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: sbatch refused the job") and "invalid partition" in line.lower(), line
