"""Two launchers on one machine acting as two nodes (``launch.py -ng 2 -gn 1 --nnodes 2 --node_rank R --master_addr
127.0.0.1 --master_port P``, one process per node) give the per-step losses of one launcher with 2 processes, for DDP
and for PP=2 with one stage per node; nodes that cannot make one job end with a named error (exit code 2).

One reference launch per layout (cached for the file).
"""

import json
import os
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import pytest

from megatron_bridge.utils.launch import reserved_port
from tests.functional_tests.launcher import REPO_ROOT, forked_workers_env


pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]


LAUNCH = REPO_ROOT / "scripts" / "performance" / "launch.py"
STEPS = 4
TIMEOUT_S = 300
LOSS_RTOL = 1e-5
LAYOUTS = {"ddp": [], "pp2": ["-pp", "2"]}


def _env() -> dict[str, str]:
    """launch.py and its torchrun agent start cold; the workers fork warm (launcher.py's forked_workers_env)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **forked_workers_env()}


def _flags(layout: str, out: Path) -> list[str]:
    return [str(LAUNCH), "--recipe", "tiny_llama", "-ms", str(STEPS), *LAYOUTS[layout], "--output_dir", str(out)]


def _node(layout: str, out: Path, node_rank: int, port: int, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, *_flags(layout, out), "-ng", "2", "-gn", "1", "--nnodes", "2", "--node_rank",
           str(node_rank), "--master_addr", "127.0.0.1", "--master_port", str(port), *extra]
    return subprocess.Popen(cmd, cwd=REPO_ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _two_nodes(layout: str, out: Path, node1_extra: tuple[str, ...] = ()) -> list[tuple[int, str]]:
    """(exit code, output) of node 0 and node 1, started together."""
    results = []
    with reserved_port() as port:
        procs = [_node(layout, out, 0, port), _node(layout, out / "node1", 1, port, *node1_extra)]
        for proc in procs:
            output, _ = proc.communicate(timeout=TIMEOUT_S)
            results.append((proc.returncode, output))
    return results


@cache
def _reference(layout: str, folder: str) -> list[float]:
    out = Path(folder) / f"reference-{layout}"
    proc = subprocess.run([sys.executable, *_flags(layout, out), "-ng", "2"], cwd=REPO_ROOT, env=_env(),
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads((out / "results.json").read_text())["losses"]


@pytest.fixture(scope="module")
def reference_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("references"))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_nodes_match_one_launcher(layout: str, tmp_path: Path, reference_dir: str) -> None:
    (code0, out0), (code1, out1) = _two_nodes(layout, tmp_path)
    assert code0 == 0 and code1 == 0, f"node 0:\n{out0[-3000:]}\nnode 1:\n{out1[-3000:]}"
    losses = json.loads((tmp_path / "results.json").read_text())["losses"]  # global rank 0 is on node 0
    reference = _reference(layout, reference_dir)
    assert len(losses) == len(reference) == STEPS
    for got, want in zip(losses, reference, strict=True):
        assert abs(got - want) <= LOSS_RTOL * abs(want), (losses, reference)


def test_a_node_with_other_overrides_is_refused(tmp_path: Path) -> None:
    (code0, out0), (code1, out1) = _two_nodes("ddp", tmp_path, node1_extra=("train.manual_gc=true",))
    assert code0 == 2 and code1 == 2, f"node 0:\n{out0[-3000:]}\nnode 1:\n{out1[-3000:]}"
    for out in (out0, out1):
        assert "the resolved config differs between the nodes of this job: node 1" in out, out[-3000:]
    assert "error (rank 1, node 1): the resolved config differs" in out1, out1[-3000:]  # messages name the node
    assert "first difference: train.manual_gc = False on rank 0, True there" in out0 + out1, out1[-3000:]
    assert "training 0.84M parameters" not in out0 + out1  # refused before any model was built


def _processes_naming(folder: Path) -> list[int]:
    """Pids of the processes whose command line names ``folder`` (launchers, torchrun, workers of that run)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(folder).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_nodes_started_with_another_restart_budget_are_refused(tmp_path: Path) -> None:
    """--max_restarts 1 on node 1 only: both nodes end with code 2 naming the flag before any worker starts, within
    the rendezvous timeout; nothing is left running (launcher/node_agreement.py)."""
    start = time.monotonic()
    (code0, out0), (code1, out1) = _two_nodes("ddp", tmp_path, node1_extra=("--max_restarts", "1", "--rdzv_timeout",
                                                                            "60"))
    assert code0 == 2 and code1 == 2, f"node 0:\n{out0[-3000:]}\nnode 1:\n{out1[-3000:]}"
    assert "error: the nodes of this job were started with different settings: --max_restarts 0 on node 0 but 1 on " \
           "node 1" in out0, out0[-3000:]
    assert "--max_restarts 1 on node 1 but 0 on node 0" in out1, out1[-3000:]
    assert "Initialized process group" not in out0 + out1  # no worker started
    assert time.monotonic() - start < 60 + 60, (out0 + out1)[-3000:]
    assert _processes_naming(tmp_path) == []


def test_nobody_at_the_rendezvous_endpoint_is_a_named_error(tmp_path: Path) -> None:
    start = time.monotonic()
    with reserved_port() as port:  # nobody listens on it
        proc = _node("ddp", tmp_path, 1, port, "--rdzv_timeout", "5")
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 2, output[-3000:]
    assert "error: node 1 could not meet the other nodes at 127.0.0.1:" in output, output[-3000:]
    assert "frame #" not in output and "c10d" not in output.split("error: node 1")[0], output[-3000:]  # one line
    assert time.monotonic() - start < 5 + 90, output[-3000:]  # the timeout plus start-up on a loaded machine


RENDEZVOUS = {"static": ["--node_rank={node}", "--master_addr=127.0.0.1", "--master_port={port}",
                          "--rdzv_conf=timeout=30"],
              "c10d": ["--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=job",
                        "--rdzv_conf=join_timeout=60"],
              "c10d-larger-last": ["--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=job",
                                   "--rdzv_conf=join_timeout=30"]}
STARTS = {"static": ((0, 3), (1, 2)), "c10d": ((0, 3), (1, 2)), "c10d-larger-last": ((1, 2), (0, 3))}
"""(node, --nnodes) in start order: under c10d the rendezvous completes with two nodes when the node asking for 3
joins first, and never when it joins last (torch completes it as the last node to join sees its own max_nodes)."""


@pytest.mark.parametrize("rendezvous", list(RENDEZVOUS))
def test_a_node_started_with_more_nodes_names_the_setting(rendezvous: str, tmp_path: Path) -> None:
    """One node with --nnodes 3, the other with 2 (torch's launcher, our agent), both rendezvous kinds. Static:
    node 0's store waits for a third node, so its own agreement never runs. c10d: torch completes the rendezvous with
    two nodes (the second node's min_nodes) when the larger count joins first, so that node would train in a job
    smaller than it asked for; with the larger count last it never completes. Either way both end with code 2 naming
    --nnodes, no worker starts, nothing is left running."""
    script = tmp_path / "job.py"
    script.write_text("print('worker started', flush=True)\n")
    start, procs = time.monotonic(), {}
    with reserved_port() as port:
        for node, nnodes in STARTS[rendezvous]:
            flags = [flag.format(node=node, port=port) for flag in RENDEZVOUS[rendezvous]]
            procs[nnodes] = subprocess.Popen([sys.executable, "-m", "megatron_bridge.launcher.torchrun",
                                              f"--nnodes={nnodes}", "--nproc_per_node=1", *flags, str(script)],
                                             cwd=REPO_ROOT, env=_env(), stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, text=True)
            time.sleep(5 if rendezvous == "c10d-larger-last" else 1)  # c10d: the first launcher hosts the rendezvous
        outs = {nnodes: proc.communicate(timeout=TIMEOUT_S)[0] for nnodes, proc in procs.items()}
    outputs = f"--nnodes 3:\n{outs[3][-3000:]}\n--nnodes 2:\n{outs[2][-3000:]}"
    assert [procs[3].returncode, procs[2].returncode] == [2, 2], outputs
    for mine, theirs in ((3, 2), (2, 3)):
        assert "error: the nodes of this job were started with different settings: --nnodes " \
               f"{mine} on node " in outs[mine] and f"but {theirs} on node " in outs[mine], outputs
    assert "worker started" not in outs[3] + outs[2]
    assert time.monotonic() - start < 60 + 60, outputs  # the rendezvous timeout plus start-up on a loaded machine
    assert _processes_naming(tmp_path) == []
