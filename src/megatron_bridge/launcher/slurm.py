"""Slurm jobs from ``scripts/performance/launch.py``: Megatron-Bridge's flags, the sbatch script, submission.

With ``-a/--account``, ``-p/--partition`` or ``--executor slurm``, launch.py writes ``sbatch.sh`` into the run folder
(from :data:`TEMPLATE`, our own template) and submits it with ``sbatch``; :mod:`megatron_bridge.launcher.slurm_follow`
follows it. The script runs one task per node: ``srun`` starts torch's launcher (``python -m
megatron_bridge.launcher.torchrun``) on every node with ``--node_rank=$SLURM_NODEID`` and a static rendezvous at node
0's ``NodeAddr`` (from ``scontrol show node``: emulated or unresolvable node names work; ``--master_addr`` overrides
it) on a port of the job's own. Every node runs the same launch.py command, which trains (rank 0 writes
``results.json`` into the run folder, on the shared filesystem).

Retries and preemption: the run's checkpoints go to ``checkpoint.save`` (default ``<run folder>/checkpoints``) and load
from there. When the training command ends unfinished, the script resubmits itself (a new job that starts after this
one ends and resumes from the last checkpoint): after a stop signal (the pre-time-limit signal, ``--preempt_time``:
``#SBATCH --signal=B:<train.exit_signal>@S``, or TERM/USR1/USR2/INT from ``scancel --signal``; also one that came
before the first step, with nothing new to save), always; after a failure, at most ``--max_retries`` times (a node
silent for ``--node_timeout`` seconds is a failure); never after a user error (exit code 2) or a cancel. Resubmission
rather than ``scontrol requeue``: a requeued job is held ~120 s by Slurm 22.05 before it runs again; ``#SBATCH
--requeue`` only lets Slurm run the job again after a node failure took the script's own node. Every job of the run
appends ``NEXT after JOB`` to ``slurm_jobs.txt``; a run folder holds one live job (:mod:`.slurm_run_dir`).

Import-light: no torch.
"""

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.errors import SlurmError
from megatron_bridge.launcher.nodes import processes_per_node
from megatron_bridge.utils.cli import EXIT_PREEMPTED, EXIT_USER_ERROR, bool_arg


TEMPLATE = Path(__file__).with_name("sbatch_template.sh")
"""The sbatch script's template: ``{{NAME}}`` placeholders filled by :func:`render_script`."""
SCRIPT_NAME = "sbatch.sh"
"""The script's name in the run folder (a resubmission submits this file again)."""
JOBS_FILE = "slurm_jobs.txt"
"""Ids of the jobs a run resubmitted, one a line (the first job's id is written by launch.py)."""
LOG_NAME = "slurm-%j.out"
"""Each job's log (stdout and stderr of the script and of every node) in the run folder; ``%j`` is the job id."""
DEFAULT_TIME_LIMIT = "00:30:00"
GPUS_PER_NODE = {"h100": 8, "b200": 8, "b300": 8, "gb200": 4, "gb300": 4, "vr200": 4, "r100": 1}
"""``-gn`` when not given, by ``-g`` (Megatron-Bridge's table); other GPUs (and CPUs) put all ``-ng`` on one node."""
SIGNAL_MAX_S = 65535
"""The largest ``--signal=...@TIME`` Slurm accepts."""
STOP_SIGNALS = ("TERM", "USR1", "USR2", "INT")
"""Signals that stop a job at one agreed step with a checkpoint, and a new job resumes (whatever
``train.exit_signal`` says; Slurm's ``--signal``, ``scancel --signal``; training/stop_signals.py)."""
DEFAULT_NODE_TIMEOUT_S = 120
"""``--node_timeout``: a node silent this long is called lost (Slurm's own ``SlurmdTimeout`` is 300 s by default)."""
MAX_IDLE_STOPS = 3
"""Jobs in a row that a stop signal may end before their first step before the chain stops (the signal comes before
training starts every time: the time limit is too short for --preempt_time)."""


# ------------------------------------------------------------------------------------------------------- flags
def list_of_strings(value: str) -> list[str]:
    """A comma-separated list (``-cm``, ``-cs``), as Megatron-Bridge's ``list_of_strings``; empty items dropped."""
    return [item for item in value.split(",") if item]


def env_vars(value: str) -> dict[str, str]:
    """``-ce A=1,B=2`` → ``{"A": "1", "B": "2"}``; a named error for an item without ``=`` or a bad name."""
    result = {}
    for item in list_of_strings(value):
        name, sep, val = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise argparse.ArgumentTypeError(f"expected NAME=VALUE items separated by commas, got {item!r}")
        result[name] = val
    return result


def slurm_params(value: str) -> dict[str, str | bool]:
    """``--additional_slurm_params``: ``key=value`` items separated by ``;`` (else by spaces; a single item may hold
    commas), a bare ``key`` is a flag; as Megatron-Bridge's ``parse_additional_slurm_params``."""
    parts = value.split(";") if ";" in value else value.split() if " " in value else [value]
    params: dict[str, str | bool] = {}
    for part in (p.strip() for p in parts):
        if part:
            key, sep, val = part.partition("=")
            params[key.strip().lstrip("-")] = val.strip() if sep else True
    return params


def add_slurm_arguments(parser: argparse.ArgumentParser) -> None:
    """Megatron-Bridge's Slurm flags (names, defaults and meanings; docs/training/multi-node.md, "Slurm")."""
    g = parser.add_argument_group("Slurm (with -a/-p or --executor slurm; docs/training/multi-node.md)")
    g.add_argument("--executor", choices=("local", "slurm"), default=None,
                   help="where to run (default: slurm with -a or -p, else local)")
    g.add_argument("-a", "--account", default=None, help="Slurm account")
    g.add_argument("-p", "--partition", default=None, help="Slurm partition")
    g.add_argument("-t", "--time_limit", default=DEFAULT_TIME_LIMIT,
                   help="the job's time limit, Slurm's format (HH:MM:SS, D-HH:MM:SS, MM; default %(default)s)")
    g.add_argument("-i", "--container_image", default=None,
                   help="container image: srun --container-image (pyxis); default none (the job runs on the host)")
    g.add_argument("-cm", "--custom_mounts", type=list_of_strings, default=[],
                   help="comma-separated container mounts SRC:DST (srun --container-mounts; needs -i)")
    g.add_argument("-ce", "--custom_env_vars", type=env_vars, default={},
                   help="comma-separated NAME=VALUE environment variables of the job")
    g.add_argument("-cs", "--custom_srun_args", type=list_of_strings, default=[],
                   help="comma-separated extra srun arguments")
    g.add_argument("--gres", default=None, help="Slurm generic resources per node, e.g. gpu:8")
    g.add_argument("--additional_slurm_params", type=slurm_params, default={},
                   help="more #SBATCH options: 'key=value;key2=value2' (a bare key is a flag)")
    g.add_argument("--max_retries", type=int, default=2,
                   help="resubmit a failed job at most this many times; it resumes from its last checkpoint "
                   "(default %(default)s)")
    g.add_argument("--detach", type=bool_arg, default=True,
                   help="true: print the job id and return; false: follow the job, stream its log, exit with its "
                   "result (default true)")
    g.add_argument("--node_timeout", type=int, default=DEFAULT_NODE_TIMEOUT_S,
                   help="seconds a node's launcher may go without a heartbeat (one every 5 s) before the script stops "
                   "the job's step as failed (a retry follows while --max_retries allow; default %(default)s)")
    g.add_argument("--status", metavar="RUN_DIR", type=Path, default=None,
                   help="report a Slurm run from its folder (--output_dir): each job's state, the checkpoint step, "
                   "the results; nothing else is needed")
    g.add_argument("--follow", metavar="RUN_DIR", type=Path, default=None,
                   help="follow a detached Slurm run from its folder, as --detach false does: stream the logs, follow "
                   "resubmitted jobs, exit with the last job's result")
    g.add_argument("--preempt_time", type=int, default=60,
                   help="seconds before the time limit at which Slurm sends train.exit_signal (default SIGTERM): "
                   "the workers save a checkpoint and stop, a new job resumes (as on TERM, USR1, USR2 or INT from "
                   "scancel --signal); 0: no signal (default %(default)s)")


def requested(args: argparse.Namespace) -> bool:
    """True when the flags ask for a Slurm job."""
    if args.executor is not None:
        return args.executor == "slurm"
    return args.account is not None or args.partition is not None


SLURM_ONLY_FLAGS = {"account": "-a/--account", "partition": "-p/--partition",  # given with --executor local
                    "time_limit": "-t/--time_limit", "container_image": "-i/--container_image",
                    "custom_mounts": "-cm/--custom_mounts", "custom_env_vars": "-ce/--custom_env_vars",
                    "custom_srun_args": "-cs/--custom_srun_args", "gres": "--gres",
                    "additional_slurm_params": "--additional_slurm_params", "max_retries": "--max_retries",
                    "detach": "--detach", "preempt_time": "--preempt_time",
                    "node_timeout": "--node_timeout"}
"""Flags that only a Slurm job reads (argument name → flag)."""


def refuse_slurm_flags(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """A local run with Slurm-only flags set would ignore them: a :class:`SlurmError` naming them."""
    given = [flag for dest, flag in SLURM_ONLY_FLAGS.items() if getattr(args, dest) != parser.get_default(dest)]
    if given and args.executor == "local":
        raise SlurmError(f"--executor local runs on this machine, which ignores the Slurm-only flags given "
                         f"({', '.join(given)}): drop them, or submit a Slurm job (--executor slurm)")
    if given:
        raise SlurmError(f"Slurm-only flags given without a Slurm job ({', '.join(given)}): add -a ACCOUNT and/or "
                         "-p PARTITION (or --executor slurm), or drop them for a run on this machine")


# ----------------------------------------------------------------------------------------------------- options
def time_limit_seconds(text: str) -> int:
    """Seconds of a Slurm time limit: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if m is None:
        raise SlurmError(f"-t/--time_limit {text!r} is not a Slurm time: give HH:MM:SS (e.g. 00:30:00), "
                         "D-HH:MM:SS or minutes")
    days, a, b, c = (int(x) if x is not None else None for x in m.groups())
    if days is not None:  # D-HH[:MM[:SS]]
        return days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None:
        return a * 3600 + b * 60 + c
    return a * 60 + (b or 0)  # MM[:SS]


@dataclass(frozen=True)
class SlurmOptions:
    """A checked Slurm request (see :func:`options_from_args`)."""

    nodes: int
    """Nodes of the job (``-ng / -gn``)."""
    nproc_per_node: int
    """Processes torch's launcher starts on each node (``-gn``)."""
    account: str | None = None
    partition: str | None = None
    time_limit: str = DEFAULT_TIME_LIMIT
    container_image: str | None = None
    custom_mounts: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    """The job's environment: the perf config's variables, then ``-ce``."""
    custom_srun_args: tuple[str, ...] = ()
    gres: str | None = None
    additional_params: dict[str, str | bool] = field(default_factory=dict)
    max_retries: int = 2
    preempt_time: int = 60
    master_addr: str | None = None
    """Node 0's address when given (``--master_addr``); else the first node's NodeAddr at run time."""
    max_restarts: int = 0
    """torch's ``--max_restarts`` inside each job (``--max_restarts``)."""
    node_timeout: int = DEFAULT_NODE_TIMEOUT_S
    """Seconds without a heartbeat after which a node is called lost (``--node_timeout``)."""


def options_from_args(args: argparse.Namespace, env: dict[str, str]) -> SlurmOptions:
    """The checked options of launch.py's flags; every bad combination is a :class:`SlurmError` naming the flag."""
    if args.nnodes != 1 or args.node_rank is not None or args.rdzv_endpoint is not None:
        raise SlurmError("--nnodes/--node_rank/--rdzv_endpoint are set by the Slurm job itself (-ng / -gn nodes, "
                         "$SLURM_NODEID): drop them, or run without -a/-p")
    per_node = args.gpus_per_node or min(GPUS_PER_NODE.get(args.gpu or "", args.num_gpus), args.num_gpus)
    per_node = processes_per_node(args.num_gpus, per_node, max(1, args.num_gpus // per_node))  # -ng % -gn: named
    limit = time_limit_seconds(args.time_limit)
    if args.preempt_time < 0 or (args.preempt_time and args.preempt_time >= min(limit, SIGNAL_MAX_S + 1)):
        raise SlurmError(f"--preempt_time {args.preempt_time} must be below the time limit (-t {args.time_limit} = "
                         f"{limit} s) and at most {SIGNAL_MAX_S}: the signal comes that many seconds before the limit "
                         "(0: no signal)")
    if args.max_retries < 0:
        raise SlurmError(f"--max_retries {args.max_retries} must be >= 0")
    if args.node_timeout < 15:
        raise SlurmError(f"--node_timeout {args.node_timeout} must be at least 15 s (3 heartbeats)")
    if args.custom_mounts and not args.container_image:
        raise SlurmError("-cm/--custom_mounts are container mounts: give the image too (-i/--container_image)")
    return SlurmOptions(
        nodes=args.num_gpus // per_node, nproc_per_node=per_node, account=args.account, partition=args.partition,
        time_limit=args.time_limit, container_image=args.container_image, custom_mounts=tuple(args.custom_mounts),
        env={**env, **args.custom_env_vars}, custom_srun_args=tuple(args.custom_srun_args), gres=args.gres,
        additional_params=dict(args.additional_slurm_params), max_retries=args.max_retries,
        preempt_time=args.preempt_time, master_addr=args.master_addr, max_restarts=args.max_restarts,
        node_timeout=args.node_timeout)


def prepare_config(cfg: ConfigContainer, run_dir: Path, options: SlurmOptions) -> None:
    """What a Slurm run changes in the config (the submitter and every node apply it alike): checkpoints save to
    ``checkpoint.save`` (default ``<run_dir>/checkpoints``) and load from there when ``checkpoint.load`` is unset, so
    a resubmitted job resumes; the workers stop at one agreed step on a stop signal (``train.exit_signal_handler=true``,
    as Megatron-Bridge's preemption plugin sets; a Slurm job's workers catch TERM, USR1, USR2 and INT whatever
    ``train.exit_signal`` says: :mod:`megatron_bridge.training.stop_signals`)."""
    ck = cfg.checkpoint
    if ck.save is None:
        ck.save = str(run_dir / "checkpoints")
    if ck.load is None:
        ck.load = ck.save
    cfg.train.exit_signal_handler = True  # any stop signal (stop_signals.SCHEDULER_STOP_SIGNALS) saves and stops


# ------------------------------------------------------------------------------------------------------ script
@dataclass(frozen=True)
class SlurmJob:
    """Everything the sbatch script needs."""

    options: SlurmOptions
    run_dir: Path
    """The run folder (absolute, on a filesystem every node sees): script, logs, results.json, checkpoints."""
    job_name: str
    command: tuple[str, ...]
    """What torch's launcher runs on every node: the script and its arguments."""
    python: str
    """The interpreter on the nodes (this one; ``python`` inside a container)."""
    workdir: Path
    """The job's working directory (where launch.py was started)."""
    train_iters: int
    """Steps of the whole run (the script compares the checkpoint step with it)."""
    checkpoint_dir: str
    exit_signal: str = "SIGTERM"
    """``train.exit_signal``: what ``--preempt_time`` asks Slurm to send."""


def sbatch_lines(job: SlurmJob) -> list[str]:
    """The ``#SBATCH`` lines of the flags."""
    o = job.options
    lines = [f"--job-name={job.job_name}"]
    lines += [f"--account={o.account}"] if o.account else []
    lines += [f"--partition={o.partition}"] if o.partition else []
    lines += [f"--nodes={o.nodes}", "--ntasks-per-node=1", f"--time={o.time_limit}",
              f"--output={job.run_dir / LOG_NAME}", "--open-mode=append", f"--chdir={job.workdir}",
              "--requeue"]  # Slurm runs the script again after a node failure (also the node it runs on)
    if o.preempt_time > 0:
        lines.append(f"--signal=B:{job.exit_signal.removeprefix('SIG')}@{o.preempt_time}")  # the script sends it on
    lines += [f"--gres={o.gres}"] if o.gres else []
    lines += [f"--{k}" if v is True else f"--{k}={v}" for k, v in o.additional_params.items()]
    return [f"#SBATCH {shlex.quote(line)}" if re.search(r"[\s'\"]", line) else f"#SBATCH {line}" for line in lines]


def srun_arguments(job: SlurmJob) -> list[str]:
    """srun's extra arguments: the container (pyxis's ``--container-image``/``--container-mounts``, with the run
    folder and this checkout mounted at their own paths), then ``-cs``."""
    o, args = job.options, []
    if o.container_image:
        repo = Path(__file__).resolve().parents[3]
        mounts = [f"{p}:{p}" for p in dict.fromkeys((str(job.run_dir), str(repo)))] + list(o.custom_mounts)
        args += [f"--container-image={o.container_image}", f"--container-mounts={','.join(mounts)}",
                 f"--container-workdir={job.workdir}"]
    return args + list(o.custom_srun_args)


def render_script(job: SlurmJob) -> str:
    """The sbatch script of ``job`` (:data:`TEMPLATE` filled in; values shell-quoted)."""
    q = shlex.quote
    o = job.options
    values = {
        "SBATCH_LINES": "\n".join(sbatch_lines(job)),
        "RUN_DIR": q(str(job.run_dir)), "CHECKPOINT_DIR": q(job.checkpoint_dir), "TRAIN_ITERS": str(job.train_iters),
        "MAX_RETRIES": str(o.max_retries), "MASTER_ADDR": q(o.master_addr or ""),
        "EXPORTS": "\n".join(f"export {k}={q(v)}" for k, v in o.env.items()),
        "NODES": str(o.nodes), "NODE_TIMEOUT": str(o.node_timeout),
        "NPROC_PER_NODE": str(o.nproc_per_node), "MAX_RESTARTS": str(o.max_restarts),
        "SRUN_ARGS": " ".join(q(a) for a in srun_arguments(job)), "PYTHON": q(job.python),
        "COMMAND": " ".join(q(a) for a in job.command), "STOP_SIGNALS": " ".join(STOP_SIGNALS),
        "STOP_SIGNALS_CSV": ",".join(f"SIG{s}" for s in STOP_SIGNALS), "MAX_IDLE_STOPS": str(MAX_IDLE_STOPS),
        "STOP_EXIT_CODES": " || ".join(f"RC == {128 + signal.Signals[f'SIG{s}']}" for s in STOP_SIGNALS),
        "EXIT_USER_ERROR": str(EXIT_USER_ERROR), "EXIT_PREEMPTED": str(EXIT_PREEMPTED),
        "SCRIPT_NAME": SCRIPT_NAME, "JOBS_FILE": JOBS_FILE,
    }
    text = TEMPLATE.read_text()
    unknown = set(re.findall(r"\{\{(\w+)\}\}", text)) - set(values)
    if unknown:
        raise KeyError(f"{TEMPLATE} names unknown placeholders {sorted(unknown)}")
    return re.sub(r"\{\{(\w+)\}\}", lambda m: values[m[1]], text)


def write_script(job: SlurmJob, text: str) -> Path:
    """Write the script into the run folder (executable); returns its path."""
    job.run_dir.mkdir(parents=True, exist_ok=True)
    path = job.run_dir / SCRIPT_NAME
    path.write_text(text)
    path.chmod(0o755)
    return path


# -------------------------------------------------------------------------------------------------- submission
CLIENT_TIMEOUT_S = 60
"""Seconds a Slurm client command (sbatch, scontrol) may take before it is a named error: nothing hangs."""


def require_sbatch() -> None:
    """A :class:`SlurmError` when Slurm's ``sbatch`` is not on PATH."""
    if shutil.which("sbatch") is None:
        raise SlurmError("-a/-p (or --executor slurm) submit a Slurm job, but `sbatch` is not on PATH: run on a "
                         "Slurm login node (or install Slurm's clients), use -d to print the script, or drop -a/-p to "
                         "run here")


def slurm_command(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client; a :class:`SlurmError` if it does not answer within :data:`CLIENT_TIMEOUT_S`."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(cmd)}` did not answer within {CLIENT_TIMEOUT_S} s: is slurmctld up? "
                         "(`sinfo`)") from None


def submit(script: Path) -> str:
    """``sbatch`` the script; returns the job id. A refused job is a :class:`SlurmError` with Slurm's message."""
    proc = slurm_command(["sbatch", "--parsable", str(script)])
    if proc.returncode != 0:
        message = " ".join(proc.stderr.split()) or f"exit code {proc.returncode}"
        raise SlurmError(f"sbatch refused the job ({message}); the script is {script}")
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed no job id ({proc.stdout.strip()!r}); the script is {script}")
    return job_id
