"""A private two-node Slurm cluster on this machine, for the Slurm tests (Debian's ``slurm-wlm`` and ``munge``).

Everything lives in one scratch folder: a munge key and socket (a private ``munged``), ``slurm.conf``, state, spool,
pid and log files. ``slurmctld`` and two ``slurmd -N n1`` / ``-N n2`` run in the foreground as children of the test
process (their pids are known; they are stopped by pid). The daemons' ports are free ports reserved while the cluster
runs (:func:`megatron_bridge.utils.launch.reserved_ports`) and job ids start at a random number (a job's rendezvous
port derives from its id), so two test runs on one machine do not collide. Nothing under /etc is read or changed:
clients find the cluster through ``SLURM_CONF`` (:meth:`SlurmCluster.env`). Settings from
``/work/shared/reference/multi-node.md``: no cgroups (``proctrack/linuxproc``, ``task/none``), no accounting database,
``SlurmUser=root``, ``MinJobAge=60``, ``OverSubscribe=FORCE:4``.
"""

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from megatron_bridge.utils.launch import reserved_ports


INSTALL_HINT = "apt-get update && apt-get install -y slurm-wlm munge"
"""What to run (as root) where the Slurm tests skip."""
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
NODES = ("n1", "n2")


def missing_programs() -> list[str]:
    """The Slurm/munge programs this machine lacks (daemons are looked up in /usr/sbin too)."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [p for p in (*DAEMONS, *CLIENTS) if shutil.which(p, path=path) is None]


def _program(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if found is None:
        raise FileNotFoundError(f"{name} is not installed ({INSTALL_HINT})")
    return found


class SlurmCluster:
    """Two emulated nodes (n1, n2) on 127.0.0.1 in partition ``partition``; ``start()``, then ``stop()``."""

    def __init__(self, root: Path, partition: str = "debug", cpus: int = 2) -> None:
        self.root, self.partition, self.cpus = root, partition, cpus
        self.conf = root / "slurm.conf"
        self.socket = root / "munge" / "munge.socket"
        self._procs: dict[str, subprocess.Popen] = {}
        self._ports = contextlib.ExitStack()  # the daemons' ports, reserved while the cluster runs

    def env(self) -> dict[str, str]:
        """The environment of a Slurm client of this cluster (``SLURM_CONF`` set; /usr/sbin on PATH)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_conf(self) -> None:
        ctld, *node_ports = self._ports.enter_context(reserved_ports(1 + len(NODES)))
        r = self.root
        lines = [
            "ClusterName=mbtest",
            f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",
            f"SlurmctldPort={ctld}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.socket}",
            "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={r}/state", f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/slurmctld.pid", f"SlurmdPidFile={r}/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/slurmctld.log", f"SlurmdLogFile={r}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none", "MpiDefault=none", "SchedulerType=sched/builtin",
            "SlurmdParameters=config_overrides", "ReturnToService=2", "MinJobAge=60", "KillWait=10",
            "InactiveLimit=0", "MailProg=/bin/true",
            # pending jobs (a run's next job, waiting on afterany or on a node back from a freeze) are looked at every
            # 2 s, not every 60 s (Slurm's default main-loop interval)
            "SchedulerParameters=sched_interval=2",
            # job ids (and so the jobs' rendezvous ports, 20000 + id % 12000) differ from another test cluster's
            f"FirstJobId={random.randrange(1000, 12000)}",
        ]
        lines += [f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={p} CPUs={self.cpus} State=UNKNOWN"
                  for n, p in zip(NODES, node_ports, strict=True)]
        lines.append(f"PartitionName={self.partition} Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP "
                     "OverSubscribe=FORCE:4")
        self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.root / f"{name}.out", "wb")  # noqa: SIM115  (closed with the process)
        self._procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                             start_new_session=True)
        log.close()

    def start(self, timeout: float = 30.0) -> "SlurmCluster":
        """Start munged, slurmctld and both slurmd; return once ``sinfo`` shows both nodes idle."""
        r = self.root
        for sub in ("munge", "state", *(f"spool/{n}" for n in NODES)):
            (r / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o755)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._write_conf()
        self._spawn("munged", [_program("munged"), "-F", "--force", f"--socket={self.socket}",
                               f"--key-file={key}", f"--pid-file={r}/munge/munged.pid",
                               f"--log-file={r}/munge/munged.log", f"--seed-file={r}/munge/munged.seed"])
        self._wait(lambda: self.socket.exists(), timeout, "munged did not create its socket")
        self._spawn("slurmctld", [_program("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        for node in NODES:
            self._spawn(f"slurmd-{node}", [_program("slurmd"), "-D", "-N", node, "-f", str(self.conf)])
        self._wait(self._nodes_idle, timeout, "the nodes did not become idle")
        return self

    def _nodes_idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout.split()
        states = dict(zip(out[::2], out[1::2], strict=False))
        return all(states.get(n) == "idle" for n in NODES)

    def _wait(self, ready, timeout: float, what: str) -> None:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [n for n, p in self._procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{what}: {dead} exited; logs: {self.logs()}")
            if ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{what} within {timeout} s; logs: {self.logs()}")

    def start_node(self, node: str) -> None:
        """Start ``node``'s slurmd again (after a test killed it: the node rebooted); returns at once."""
        self._spawn(f"slurmd-{node}", [_program("slurmd"), "-D", "-N", node, "-f", str(self.conf)])

    def pid(self, name: str) -> int:
        """The pid of a daemon of this cluster (``slurmctld``, ``slurmd-n1``, ...)."""
        return self._procs[name].pid

    def logs(self) -> str:
        """The tail of every daemon's log (for failure messages)."""
        parts = []
        for path in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    def run(self, cmd: list[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster."""
        return subprocess.run(cmd, env=self.env(), capture_output=True, text=True, check=check, timeout=timeout)

    def queue(self) -> list[str]:
        """Ids of the jobs pending or running."""
        return self.run(["squeue", "-h", "-o", "%i"]).stdout.split()

    def job_state(self, job_id: str) -> str:
        """``JobState`` from ``scontrol show job`` (finished jobs stay visible for MinJobAge seconds)."""
        out = self.run(["scontrol", "-o", "show", "job", job_id], check=False).stdout
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        return fields.get("JobState", "UNKNOWN")

    def cancel_all(self, timeout: float = 60.0) -> None:
        """Cancel every job and wait until the queue is empty."""
        self.run(["scancel", f"--partition={self.partition}"], check=False)
        deadline = time.monotonic() + timeout
        while self.queue() and time.monotonic() < deadline:
            time.sleep(0.2)

    def stop(self) -> None:
        """Cancel the jobs, then stop the daemons by pid (SIGTERM, SIGKILL after 10 s): no process is left."""
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            try:
                self.cancel_all()
            except (subprocess.SubprocessError, OSError):
                pass
        for name in [n for n in self._procs if n.startswith("slurmd")] + ["slurmctld", "munged"]:
            proc = self._procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._ports.close()
