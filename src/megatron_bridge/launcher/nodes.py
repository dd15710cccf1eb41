"""One job over several nodes: the node flags of the launch scripts, their checks, and the per-node torchrun flags.

Every node runs the same command with its own ``--node_rank``; torch's launcher (``torch.distributed.run``,
through ``python -m megatron_bridge.launcher.torchrun``) starts ``nproc_per_node`` workers there and meets the other
nodes at the rendezvous:

* ``--master_addr A --master_port P`` (with ``--node_rank``): torch's static rendezvous, node 0 hosts the store at
  ``A:P``. Node ``R`` holds the global ranks ``R*nproc_per_node ...`` (a stable order: node 0 holds rank 0).
* ``--rdzv_endpoint HOST:PORT`` with ``--node_rank``: the same static rendezvous at that endpoint (node order stays
  the ``--node_rank`` order; torch's c10d rendezvous orders nodes by host name and process id instead, measured to put
  rank 0 on the second node in 3 of 5 runs).
* ``--rdzv_endpoint HOST:PORT`` without ``--node_rank``: torch's c10d rendezvous; torch picks the node order.

``--max_restarts K``: torch's elastic agent restarts every worker of the job up to K times when one fails
(:mod:`megatron_bridge.launcher.restart` decides which failures are worth it). Import-light: no torch.
"""

import argparse
from dataclasses import dataclass

from megatron_bridge.errors import LaunchError


DEFAULT_RDZV_TIMEOUT_S = 600
"""Seconds a node waits at the rendezvous for the others (torch's default for the static rendezvous)."""
RDZV_ID = "megatron-bridge"
"""The c10d rendezvous id every node passes (one job per endpoint)."""
LOCALHOST = "127.0.0.1"


@dataclass(frozen=True)
class NodeLayout:
    """How the processes of one job are spread over nodes, and the restart budget."""

    nnodes: int = 1
    """Number of nodes (machines) of the job."""
    node_rank: int | None = None
    """This node's index, 0 .. nnodes-1 (node 0 holds global rank 0); None: torch's c10d rendezvous picks it."""
    master_addr: str | None = None
    """Address of node 0, where the rendezvous store listens (static rendezvous)."""
    master_port: int | None = None
    """Port of the rendezvous store on node 0 (default 29500 with several nodes; a free port on one node)."""
    rdzv_endpoint: str | None = None
    """``HOST:PORT`` of the rendezvous (instead of master_addr/master_port)."""
    rdzv_timeout: int = DEFAULT_RDZV_TIMEOUT_S
    """Seconds to wait for the other nodes before failing with a named error."""
    max_restarts: int = 0
    """How often torch's agent restarts all workers after a failure (0: a failure ends the job)."""

    @property
    def multi_node(self) -> bool:
        """True when the job spans more than one node."""
        return self.nnodes > 1

    def needs_launcher(self, nproc_per_node: int) -> bool:
        """True when the script must be run under torchrun (several processes, nodes, or a restart budget)."""
        return nproc_per_node > 1 or self.multi_node or self.max_restarts > 0 or self.master_addr is not None

    def world_size(self, nproc_per_node: int) -> int:
        """Processes of the whole job."""
        return self.nnodes * nproc_per_node


def port_number(value: str) -> int:
    """A TCP port, 1 .. 65535."""
    try:
        number = int(value, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 1..65535, got {value!r}") from None
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 1..65535, got {number}")
    return number


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    """The node and restart flags (torch's names; both ``--node_rank`` and ``--node-rank`` spellings)."""
    from megatron_bridge.utils.cli import non_negative_int, positive_int

    g = parser.add_argument_group("nodes and restarts (torch.distributed.run's flags; docs/training/multi-node.md)")
    g.add_argument("--nnodes", type=positive_int, default=1, help="nodes of the job (run the same command on each)")
    g.add_argument("--node_rank", "--node-rank", dest="node_rank", type=non_negative_int, default=None,
                   help="this node's index, 0..nnodes-1 (node 0 holds rank 0 and the rendezvous store)")
    g.add_argument("--master_addr", "--master-addr", dest="master_addr", default=None,
                   help="address of node 0 (static rendezvous)")
    g.add_argument("--master_port", "--master-port", dest="master_port", type=port_number, default=None,
                   help="port of the rendezvous store on node 0 (default 29500 with several nodes)")
    g.add_argument("--rdzv_endpoint", "--rdzv-endpoint", dest="rdzv_endpoint", default=None,
                   help="HOST:PORT of the rendezvous, instead of --master_addr/--master_port (with --node_rank: node "
                   "order as given; without: torch's c10d rendezvous orders the nodes)")
    g.add_argument("--rdzv_timeout", "--rdzv-timeout", dest="rdzv_timeout", type=positive_int,
                   default=DEFAULT_RDZV_TIMEOUT_S, help="seconds to wait for the other nodes (default %(default)s)")
    g.add_argument("--max_restarts", "--max-restarts", dest="max_restarts", type=non_negative_int, default=0,
                   help="restart every worker up to this many times after a failure; they resume from the last "
                   "checkpoint (default 0)")


def node_layout(args: argparse.Namespace) -> NodeLayout:
    """The checked :class:`NodeLayout` of parsed arguments (raises :class:`~megatron_bridge.errors.LaunchError`)."""
    layout = NodeLayout(nnodes=args.nnodes, node_rank=args.node_rank, master_addr=args.master_addr,
                        master_port=args.master_port, rdzv_endpoint=args.rdzv_endpoint,
                        rdzv_timeout=args.rdzv_timeout, max_restarts=args.max_restarts)
    check_node_layout(layout)
    return layout


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``HOST:PORT`` → (host, port); a named error for anything else."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise LaunchError(f"--rdzv_endpoint {endpoint!r} is not HOST:PORT: give node 0's address and a free port, "
                          "e.g. --rdzv_endpoint node0:29500")
    return host.strip("[]"), int(port)


def check_node_layout(layout: NodeLayout) -> None:
    """Refuse flags that cannot make a job, before anything starts (each message names the flag and the fix)."""
    if layout.node_rank is not None and layout.node_rank >= layout.nnodes:
        raise LaunchError(f"--node_rank {layout.node_rank} with --nnodes {layout.nnodes}: node ranks are 0.."
                          f"{layout.nnodes - 1}; give each node its index (e.g. $SLURM_NODEID)")
    if layout.master_addr is not None and not layout.master_addr.strip():
        raise LaunchError("--master_addr is empty (an unset variable?): give node 0's address, the same on every node")
    if layout.master_addr is not None and layout.rdzv_endpoint is not None:
        raise LaunchError("--master_addr and --rdzv_endpoint both given: give one (--rdzv_endpoint HOST:PORT is "
                          "--master_addr HOST --master_port PORT)")
    if layout.master_port is not None and layout.master_addr is None and layout.multi_node:
        raise LaunchError("--master_port without --master_addr: give node 0's address too (--master_addr)")
    if layout.rdzv_endpoint is not None:
        parse_endpoint(layout.rdzv_endpoint)
    if not layout.multi_node:
        return
    if layout.master_addr is None and layout.rdzv_endpoint is None:
        raise LaunchError(f"--nnodes {layout.nnodes} without a rendezvous: give --master_addr (node 0's address, "
                          "with --node_rank) or --rdzv_endpoint HOST:PORT, the same on every node")
    if layout.max_restarts > 0 and layout.rdzv_endpoint is not None and layout.node_rank is None:
        raise LaunchError(f"--max_restarts {layout.max_restarts} with the c10d rendezvous (--rdzv_endpoint without "
                          "--node_rank): torch counts restarts per node and restarts a healthy node without counting, "
                          "so the nodes would disagree on the attempt; give --node_rank on every node")
    if layout.master_addr is not None and layout.node_rank is None:
        raise LaunchError(f"--nnodes {layout.nnodes} with --master_addr needs --node_rank on every node (0.."
                          f"{layout.nnodes - 1}; node 0 is the one at --master_addr)")


def torchrun_arguments(layout: NodeLayout, nproc_per_node: int, free_port: int | None = None) -> list[str]:
    """torch.distributed.run's flags for this node (before the script); ``free_port`` serves one-node jobs."""
    args = [f"--nnodes={layout.nnodes}", f"--nproc_per_node={nproc_per_node}", f"--max_restarts={layout.max_restarts}"]
    if layout.rdzv_endpoint is not None and layout.node_rank is None:  # c10d: torch orders the nodes
        return [*args, "--rdzv_backend=c10d", f"--rdzv_endpoint={layout.rdzv_endpoint}", f"--rdzv_id={RDZV_ID}",
                f"--rdzv_conf=join_timeout={layout.rdzv_timeout}"]
    if layout.rdzv_endpoint is not None:
        host, port = parse_endpoint(layout.rdzv_endpoint)
    else:
        host = layout.master_addr or LOCALHOST
        port = layout.master_port or (29500 if layout.multi_node or free_port is None else free_port)
    return [*args, f"--node_rank={layout.node_rank or 0}", f"--master_addr={host}", f"--master_port={port}",
            f"--rdzv_conf=timeout={layout.rdzv_timeout}"]



def processes_per_node(num_gpus: int, gpus_per_node: int | None, nnodes: int) -> int:
    """launch.py's processes per node: ``-gn`` (``-ng`` must be ``--nnodes`` × ``-gn``), or ``-ng / --nnodes``."""
    if gpus_per_node is None:
        if num_gpus % nnodes:
            raise LaunchError(f"-ng {num_gpus} over --nnodes {nnodes}: -ng (processes of the whole job) must be a "
                              f"multiple of --nnodes; give -gn (processes per node) and -ng = --nnodes x -gn")
        return num_gpus // nnodes
    if num_gpus % gpus_per_node:
        nearest = gpus_per_node * max(1, num_gpus // gpus_per_node)
        raise LaunchError(f"-ng {num_gpus} is not a multiple of -gn {gpus_per_node}: -ng counts the processes of "
                          f"the whole job, -gn those of one node; e.g. -ng {nearest}")
    nodes = num_gpus // gpus_per_node
    if nodes != nnodes:
        raise LaunchError(f"-ng {num_gpus} / -gn {gpus_per_node} is {nodes} node(s) but --nnodes is {nnodes}: run "
                          f"the command on each node with --nnodes {nodes} --node_rank R --master_addr NODE0 "
                          "(docs/training/multi-node.md), or submit it to Slurm with -a/-p")
    return gpus_per_node
