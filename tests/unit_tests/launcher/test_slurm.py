"""launch.py's Slurm flags and the sbatch script (no cluster here: tests/functional_tests/slurm runs the jobs)."""

import argparse
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron_bridge.checkpoint import run_folder
from megatron_bridge.errors import LaunchError, SlurmError
from megatron_bridge.launcher import slurm, slurm_follow, slurm_run_dir
from megatron_bridge.perf.args import build_config, build_parser


REPO = Path(__file__).resolve().parents[3]
RUN = ["-mr", "tiny_llama", "-ng", "2", "-gn", "1", "-ms", "10"]


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args([*RUN, *argv])


def _job(args: argparse.Namespace, run_dir: Path = Path("/shared/run")) -> slurm.SlurmJob:
    options = slurm.options_from_args(args, {"NCCL_X": "1"})
    cfg = build_config(args)
    slurm.prepare_config(cfg, run_dir, options)
    return slurm.SlurmJob(options=options, run_dir=run_dir, job_name="mb-run", command=("/repo/launch.py", "-ng", "2"),
                          python="/venv/bin/python", workdir=Path("/repo"), train_iters=cfg.train_iters,
                          checkpoint_dir=cfg.checkpoint.save, exit_signal=cfg.train.exit_signal)


@pytest.mark.parametrize(("text", "seconds"), [("00:30:00", 1800), ("30", 1800), ("10:30", 630),
                                               ("1-02", 93600), ("1-00:00:10", 86410), ("2-01:30", 178200)])
def test_time_limit_in_slurms_formats(text: str, seconds: int) -> None:
    assert slurm.time_limit_seconds(text) == seconds


def test_bad_time_limit_is_named() -> None:
    with pytest.raises(SlurmError, match="-t/--time_limit '1h' is not a Slurm time"):
        slurm.time_limit_seconds("1h")


def test_flag_value_parsers() -> None:
    assert slurm.list_of_strings("/a:/a,/b:/c") == ["/a:/a", "/b:/c"]
    assert slurm.env_vars("A=1,B=x=y") == {"A": "1", "B": "x=y"}
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=VALUE"):
        slurm.env_vars("A")
    assert slurm.slurm_params("nodelist=n001,n002;constraint=gpu;exclusive") == {
        "nodelist": "n001,n002", "constraint": "gpu", "exclusive": True}
    assert slurm.slurm_params("reservation=r qos=high") == {"reservation": "r", "qos": "high"}


def test_megatron_bridge_defaults() -> None:
    args = _args()
    assert (args.time_limit, args.max_retries, args.preempt_time, args.detach) == ("00:30:00", 2, 60, True)
    assert not slurm.requested(args)
    assert slurm.requested(_args("-a", "acct")) and slurm.requested(_args("-p", "part"))
    assert slurm.requested(_args("--executor", "slurm"))
    assert not slurm.requested(_args("-a", "x", "--executor", "local"))


def test_gpus_per_node_default_follows_the_gpu_type() -> None:
    args = build_parser().parse_args(["-mr", "tiny_llama", "-ng", "16", "-g", "h100", "-p", "x"])
    options = slurm.options_from_args(args, {})
    assert (options.nodes, options.nproc_per_node) == (2, 8)
    one_node = slurm.options_from_args(build_parser().parse_args(["-mr", "tiny_llama", "-ng", "4", "-p", "x"]), {})
    assert (one_node.nodes, one_node.nproc_per_node) == (1, 4)


@pytest.mark.parametrize(("argv", "error", "message"), [
    (["-ng", "3", "-gn", "2"], LaunchError, "-ng 3 is not a multiple of -gn 2"),
    (["-t", "00:01:00", "--preempt_time", "60"], SlurmError, "--preempt_time 60 must be below the time limit"),
    (["--preempt_time", "-5"], SlurmError, "--preempt_time -5"),
    (["--max_retries", "-1"], SlurmError, "--max_retries -1"),
    (["-cm", "/data:/data"], SlurmError, "give the image too"),
    (["--nnodes", "2"], SlurmError, "set by the Slurm job itself"),
])
def test_bad_combinations_are_named(argv: list[str], error: type, message: str) -> None:
    with pytest.raises(error, match=message.replace("(", r"\(")):
        slurm.options_from_args(_args("-p", "x", *argv), {})


def test_prepare_config_resumes_from_the_run_folder(tmp_path: Path) -> None:
    args = _args("-p", "x")
    cfg = build_config(args)
    slurm.prepare_config(cfg, tmp_path, slurm.options_from_args(args, {}))
    assert cfg.checkpoint.save == cfg.checkpoint.load == str(tmp_path / "checkpoints")
    assert cfg.train.exit_signal_handler and cfg.train.exit_signal == "SIGTERM"
    own = _args("-p", "x", "--preempt_time", "0", "checkpoint.save=/ck", "train.exit_signal=SIGUSR1")
    cfg = build_config(own)
    slurm.prepare_config(cfg, tmp_path, slurm.options_from_args(own, {}))
    assert cfg.checkpoint.save == cfg.checkpoint.load == "/ck"
    assert cfg.train.exit_signal_handler  # a stop signal from the user (scancel --signal) saves too


def test_script_holds_the_flags() -> None:
    args = _args("-a", "acct", "-p", "batch", "-t", "01:00:00", "--gres", "gpu:8", "-ce", "A=1,B=two words",
                 "--custom_srun_args=--mpi=pmix,--exclusive", "--additional_slurm_params", "constraint=h100;exclusive",
                 "--max_retries", "3", "--preempt_time", "120", "--max_restarts", "1")
    text = slurm.render_script(_job(args))
    for line in ("#SBATCH --job-name=mb-run", "#SBATCH --account=acct", "#SBATCH --partition=batch",
                 "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --time=01:00:00",
                 "#SBATCH --output=/shared/run/slurm-%j.out", "#SBATCH --chdir=/repo", "#SBATCH --signal=B:TERM@120",
                 "#SBATCH --gres=gpu:8", "#SBATCH --constraint=h100", "#SBATCH --exclusive",
                 "export NCCL_X=1", "export A=1", "export B='two words'", "MAX_RETRIES=3", "TRAIN_ITERS=10",
                 "CHECKPOINT_DIR=/shared/run/checkpoints", "--nnodes=2 --nproc_per_node=1 --max_restarts=1",
                 '--node_rank="$SLURM_NODEID"', "--mpi=pmix --exclusive", 'trap "" TERM USR1 USR2 INT',
                 "/venv/bin/python",
                 "--stop_signals=SIGTERM,SIGUSR1,SIGUSR2,SIGINT", "--signals_to_handle=SIGHUP,SIGQUIT",
                 "/repo/launch.py -ng 2"):
        assert line in text, line
    assert "{{" not in text and "--container" not in text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)  # valid bash


def test_script_with_container_and_without_signal() -> None:
    args = _args("-p", "x", "-i", "nvcr.io/nvidia/nemo:dev", "-cm", "/data:/data", "--preempt_time", "0",
                 "--master_addr", "10.0.0.1")
    text = slurm.render_script(_job(args))
    assert "--container-image=nvcr.io/nvidia/nemo:dev" in text
    assert f"--container-mounts=/shared/run:/shared/run,{REPO}:{REPO},/data:/data" in text
    assert "#SBATCH --signal" not in text and "MASTER_ADDR=10.0.0.1" in text


def test_sbatch_missing_is_one_error_line(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    proc = subprocess.run([sys.executable, "scripts/performance/launch.py", *RUN, "-a", "acct", "-p", "part",
                           "--output_dir", str(tmp_path / "run")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip().splitlines()[-1]]
    assert proc.stderr.startswith("error: -a/-p (or --executor slurm) submit a Slurm job, but `sbatch` is not on PATH")
    assert not (tmp_path / "run").exists()


def test_dryrun_prints_the_script_without_sbatch(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    proc = subprocess.run([sys.executable, "scripts/performance/launch.py", *RUN, "-a", "acct", "-p", "part", "-d",
                           "--output_dir", str(tmp_path / "run")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash") and "#SBATCH --partition=part" in proc.stdout
    assert " -d " not in proc.stdout and not (tmp_path / "run").exists()


def _run_lock_clearing(tmp_path: Path, lock: dict, jobs: list[str], job_id: str) -> subprocess.CompletedProcess:
    """Run the script's clear_stale_lock() in a run folder holding ``lock`` and the jobs file ``jobs``."""
    text = slurm.render_script(_job(_args("-p", "x"), run_dir=tmp_path))
    function = re.search(r"^clear_stale_lock\(\) \{.*?^\}$", text, re.S | re.M).group(0)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "run.lock").write_text(json.dumps(lock))
    (tmp_path / slurm.JOBS_FILE).write_text("".join(f"{j}\n" for j in jobs))
    script = (f"say() {{ echo \"$*\"; }}\n{function}\nRUN_DIR={tmp_path}\nCHECKPOINT_DIR={tmp_path}/checkpoints\n"
              f"SLURM_JOB_ID={job_id}\nclear_stale_lock\n")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)


def test_a_lock_of_an_ended_job_of_the_run_is_removed(tmp_path: Path) -> None:
    # what acquire_lock writes under Slurm: rank 0 of job 7 was killed on another host
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_JOB_ID", "7")
        run_folder.acquire_lock(tmp_path / "probe")
    lock = json.loads((tmp_path / "probe" / run_folder.LOCK_FILENAME).read_text())
    assert lock["slurm_job_id"] == "7"
    lock["host"] = "another-node"
    proc = _run_lock_clearing(tmp_path, lock, ["7", "8"], job_id="8")
    assert "removed the checkpoint lock of job 7" in proc.stdout
    assert not (tmp_path / "checkpoints" / "run.lock").exists()


@pytest.mark.parametrize(("holder", "jobs"), [("5", ["7", "8"]), ("8", ["7", "8"]), (None, ["7", "8"])],
                         ids=["another-run", "this-job", "no-slurm-id"])
def test_other_locks_stay(tmp_path: Path, holder: str | None, jobs: list[str]) -> None:
    proc = _run_lock_clearing(tmp_path, {"pid": 1, "host": "h", "slurm_job_id": holder}, jobs, job_id="8")
    assert proc.stdout == "" and (tmp_path / "checkpoints" / "run.lock").exists()


def test_follow_helpers(tmp_path: Path) -> None:
    # job 41 resubmitted 57; 44 is another run's job written into the folder (followers must not take it)
    (tmp_path / slurm.JOBS_FILE).write_text("41\n44\n57 after 41\n60 after 57\n")
    assert slurm_follow.successor(tmp_path, "41") == "57" and slurm_follow.successor(tmp_path, "57") == "60"
    assert slurm_follow.successor(tmp_path, "60") is None and slurm_follow.successor(tmp_path, "44") is None
    assert slurm_follow.log_path(tmp_path, "41") == tmp_path / "slurm-41.out"
    tail, out = slurm_follow.LogTail(tmp_path / "slurm-41.out"), io.StringIO()
    tail.copy(out)  # no log yet
    (tmp_path / "slurm-41.out").write_text("one\n")
    tail.copy(out)
    with open(tmp_path / "slurm-41.out", "a") as f:
        f.write("two\n")
    tail.copy(out)
    assert out.getvalue() == "one\ntwo\n"



def test_pending_reason_is_said_only_when_slurm_names_one() -> None:
    """Slurm's ``Reason=None`` (just submitted) is no reason to print: "pending", not "pending (None)"."""
    assert slurm_follow.pending_reason(slurm_follow.JobStatus("PENDING", 0)) == ""
    assert slurm_follow.pending_reason(slurm_follow.JobStatus("PENDING", 0, "Priority")) == " (reason: Priority)"


@pytest.mark.parametrize("argv", [["-t", "01:00:00"], ["--max_retries", "0"], ["--detach", "false"],
                                  ["-i", "image"], ["-ce", "A=1"], ["--preempt_time", "30"]])
def test_slurm_only_flags_are_refused_locally(argv: list[str]) -> None:
    parser = build_parser()
    with pytest.raises(SlurmError, match="Slurm-only flags given without a Slurm job"):
        slurm.refuse_slurm_flags(parser.parse_args([*RUN, *argv]), parser)
    slurm.refuse_slurm_flags(parser.parse_args(RUN), parser)  # defaults: a local run
    slurm.refuse_slurm_flags(parser.parse_args([*RUN, "--detach", "true"]), parser)  # the default, spelled out


def test_executor_local_with_slurm_flags_is_refused_by_name() -> None:
    parser = build_parser()
    with pytest.raises(SlurmError, match=r"--executor local runs on this machine.*\(-a/--account, -p/--partition\)"):
        slurm.refuse_slurm_flags(parser.parse_args([*RUN, "--executor", "local", "-a", "acct", "-p", "part"]), parser)


def _fake_states(monkeypatch: pytest.MonkeyPatch, states: dict[str, str]) -> None:
    def status(job: str) -> slurm_follow.JobStatus | None:
        return slurm_follow.JobStatus(states[job], 0) if job in states else None

    monkeypatch.setattr(slurm_run_dir, "job_status", status)


def test_a_live_run_folder_is_refused_naming_its_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / slurm.JOBS_FILE).write_text("41\n57 after 41\n")
    _fake_states(monkeypatch, {"41": "COMPLETED", "57": "RUNNING"})
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SlurmError, match=rf"{tmp_path} belongs to Slurm job 57, which is still pending or running"):
        slurm_run_dir.refuse_live_run(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    _fake_states(monkeypatch, {"41": "COMPLETED", "57": "TIMEOUT"})
    slurm_run_dir.refuse_live_run(tmp_path)  # every job ended: a new submit resumes the run
    slurm_run_dir.refuse_live_run(tmp_path / "new")  # no run yet


def test_a_submit_waits_for_the_folders_lock_then_sees_the_job(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The first launch holds the submit lock of a brand-new folder until its jobs file names its job; a second one
    started meanwhile waits, then is refused naming that job."""
    import threading

    run_dir = tmp_path / "new run"
    _fake_states(monkeypatch, {"41": "PENDING"})
    outcome: list[str] = []

    def second() -> None:
        try:
            with slurm_run_dir.submission(run_dir):
                outcome.append("submitted")
        except SlurmError as exc:
            outcome.append(str(exc))

    with slurm_run_dir.submission(run_dir):
        thread = threading.Thread(target=second)
        thread.start()
        thread.join(timeout=1.0)
        assert thread.is_alive() and outcome == []  # waits for the lock
        (run_dir / slurm.JOBS_FILE).write_text("41\n")
    thread.join(timeout=10)
    assert len(outcome) == 1 and "belongs to Slurm job 41, which is still pending or running" in outcome[0], outcome


def test_status_reports_every_job_and_the_checkpoint_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sbatch.sh").write_text(f"CHECKPOINT_DIR={tmp_path}/ck\nTRAIN_ITERS=10\n")
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "latest_checkpointed_iteration.txt").write_text("4")
    (tmp_path / slurm.JOBS_FILE).write_text("41\n57 after 41\n")
    _fake_states(monkeypatch, {"57": "PENDING"})
    lines = slurm_run_dir.status_report(tmp_path)
    assert lines[0] == f"Slurm run {tmp_path}: 2 job(s), checkpoint step 4 of 10"
    assert lines[1].startswith("  job 41: gone from Slurm's memory") and lines[2].startswith("  job 57: PENDING,")
    assert lines[3] == "  results: none yet"
    assert slurm_run_dir.job_to_follow(tmp_path) == "57"
    with pytest.raises(SlurmError, match="holds no Slurm run"):
        slurm_run_dir.status_report(tmp_path / "nothing")


def test_script_says_every_line_with_a_timestamp(tmp_path: Path) -> None:
    text = slurm.render_script(_job(_args("-p", "x"), run_dir=tmp_path))
    say = re.search(r"^say\(\) \{.*\}$", text, re.M).group(0)
    out = subprocess.run(["bash", "-c", f"SLURM_JOB_ID=7\n{say}\nsay hello"], capture_output=True, text=True).stdout
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \[slurm job 7\] hello\n", out), out


def test_sbatch_paths_with_spaces_are_quoted() -> None:
    text = slurm.render_script(_job(_args("-p", "x"), run_dir=Path("/shared/my run")))
    assert "#SBATCH '--output=/shared/my run/slurm-%j.out'" in text
    assert "RUN_DIR='/shared/my run'" in text


def test_a_node_without_heartbeats_is_stopped_within_node_timeout(tmp_path: Path) -> None:
    """The script's watch_nodes(): node 1's launcher writes no new heartbeat, node 0's does; after --node_timeout
    (1 s here, polled every 0.2 s instead of 5 s) node 1 is named and the step stopped (scancel, then srun killed)."""
    text = slurm.render_script(_job(_args("-p", "x", "--node_timeout", "15"), run_dir=tmp_path))
    function = re.search(r"^watch_nodes\(\) \{.*?^\}$", text, re.S | re.M).group(0).replace("sleep 5", "sleep 0.2")
    beats = tmp_path / "beats"
    beats.mkdir()
    (beats / "node1").write_text("7\n")
    script = (f"say() {{ echo \"$*\"; }}\nscancel() {{ echo \"$*\" > {tmp_path}/scancel; }}\n"
              "sleep() { command sleep 0.2; }\n"
              f"{function}\nMB_HEARTBEATS={beats}\nNODE_TIMEOUT=1\nSLURM_JOB_ID=7\n"
              "command sleep 60 & SRUN_PID=$!\n"
              f"( for i in $(seq 100); do echo $i > {beats}/node0; command sleep 0.1; done ) &\n"
              "start=$SECONDS; watch_nodes; echo \"took $((SECONDS - start))\"; wait $SRUN_PID; echo \"srun $?\"\n")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60).stdout
    assert re.search(r"node 1 stopped answering: no heartbeat for \d s \(--node_timeout 1\)", out), out
    assert "node 0 stopped" not in out and "srun 137" in out, out
    assert (tmp_path / "scancel").read_text() == "--signal=KILL 7.0\n"
    assert (beats / "silent").read_text() == "node 1\n"
    assert int(re.search(r"took (\d+)", out).group(1)) <= 4, out


def test_a_silent_running_job_is_said_to_be_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--detach false on a job that prints nothing for a while says what it waits for, and on which nodes."""
    states = iter([slurm_follow.JobStatus("RUNNING", 0, nodes="n[1-2]")] * 6 + [slurm_follow.JobStatus("COMPLETED", 0)])
    monkeypatch.setattr(slurm_follow, "job_status", lambda job: next(states))
    notes: list[str] = []
    code = slurm_follow.follow(tmp_path, "41", out=io.StringIO(), poll_s=0.01, note=notes.append, quiet_s=0.02)
    assert code == 0
    assert any(n.startswith("Slurm job 41 is RUNNING on n[1-2], no new output for ") and "--node_timeout" in n
               for n in notes), notes


def test_the_launcher_heartbeat_counts_up(tmp_path: Path) -> None:
    from megatron_bridge.launcher.torchrun import start_heartbeat

    beat = tmp_path / "hb" / "node0"
    stop = start_heartbeat(str(beat), every_s=0.05)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (beat.exists() and beat.read_text().strip() not in ("", "1", "2")):
            time.sleep(0.05)
        assert int(beat.read_text()) >= 3
    finally:
        stop.set()
