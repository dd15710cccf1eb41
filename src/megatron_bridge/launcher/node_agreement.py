"""The nodes of one job agree on their launch settings before any worker starts: node count (``--nnodes``), processes
per node (``--nproc_per_node``) and restart budget (``--max_restarts``).

Each node's launcher writes its settings into the rendezvous store (node 0 hosts it) right after the rendezvous, before
torch assigns ranks: node 0 compares every other node's settings with its own as they arrive and writes the verdict;
every other node compares its own with node 0's and then waits for the verdict. A difference ends every node with one
named error (:class:`~megatron_bridge.errors.LaunchError`, exit code 2) within the rendezvous timeout, before any
worker exists: no hang in torch's rank assignment, no job of a world size nobody asked for, nothing left behind.
(``--master_addr``/``--master_port`` need no comparison: nodes that reached the same store agree on them.)

Node 0 of a static rendezvous (``--master_addr`` with ``--node_rank``) hosts the store and waits inside torch's
``TCPStore`` for as many nodes as its ``--nnodes`` says, before any of the above runs: started with a larger
``--nnodes`` than the others it would only time out. :class:`SettingsWatcher` reads the arriving nodes' settings
meanwhile (a client of its own store that does not count as a node); at the first difference it publishes node 0's
settings and the verdict, so every other node stops at once naming the flag, and node 0 names it when its wait ends.

torch's c10d rendezvous (``--rdzv_endpoint`` without ``--node_rank``) has no node ranks before it completes, and it
never completes when the last node to join asks for more nodes than are there. :class:`ArrivalWatcher` registers
each launcher's settings in the rendezvous store under an arrival number as it starts to wait and compares every
other arrival's with its own, so a node whose wait ends names the difference instead of a bare timeout.
"""

import json
import os
import socket
import threading
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from megatron_bridge.errors import LaunchError


PREFIX = "megatron_bridge/node_settings/"
VERDICT_KEY = PREFIX + "verdict"
ARRIVALS_KEY = PREFIX + "arrivals"
OK = "ok"
FLAGS = {"nnodes": "--nnodes", "nproc_per_node": "--nproc_per_node", "max_restarts": "--max_restarts"}
"""Each compared setting and the flag that sets it."""


@dataclass(frozen=True)
class NodeSettings:
    """What every node of a job must be started with alike."""

    nnodes: int
    nproc_per_node: int
    max_restarts: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str | bytes) -> "NodeSettings":
        return NodeSettings(**json.loads(text))


def difference(node: int | str, mine: NodeSettings, other_node: int | str, theirs: NodeSettings) -> str | None:
    """``--nnodes 3 on node 1 but 2 on node 0 ...`` for the first setting that differs, else None."""
    for field, flag in FLAGS.items():
        a, b = getattr(mine, field), getattr(theirs, field)
        if a != b:
            return (f"the nodes of this job were started with different settings: {flag} {a} on node {node} but "
                    f"{b} on node {other_node}; start every node with the same {flag} (only --node_rank differs)")
    return None


def agree(store: Any, node: int, mine: NodeSettings, timeout_s: float) -> None:
    """Exchange and compare settings through ``store`` (torch's ``Store``); raises :class:`LaunchError` naming the
    first difference, or a node that did not arrive within ``timeout_s``, on every node that is there."""
    store.set(f"{PREFIX}{node}", mine.to_json())
    if node == 0:
        _node_zero(store, mine, timeout_s)
        return
    theirs = NodeSettings.from_json(_get(store, f"{PREFIX}0", timeout_s, "node 0"))
    problem = difference(node, mine, 0, theirs)
    if problem is not None:
        store.set(VERDICT_KEY, problem)
        raise LaunchError(problem)
    verdict = _get(store, VERDICT_KEY, timeout_s, "node 0's check of the other nodes").decode(errors="replace")
    if verdict != OK:
        raise LaunchError(verdict)


def _node_zero(store: Any, mine: NodeSettings, timeout_s: float) -> None:
    for other in range(1, mine.nnodes):
        key = f"{PREFIX}{other}"
        try:
            theirs = NodeSettings.from_json(_get(store, key, timeout_s, f"node {other}"))
        except LaunchError as exc:
            store.set(VERDICT_KEY, str(exc))
            raise
        problem = difference(0, mine, other, theirs)
        if problem is None and store.check([VERDICT_KEY]):  # a node reported its own difference first
            verdict = store.get(VERDICT_KEY).decode(errors="replace")
            problem = None if verdict == OK else verdict
        if problem is not None:
            store.set(VERDICT_KEY, problem)
            raise LaunchError(problem)
    store.set(VERDICT_KEY, OK)


def _get(store: Any, key: str, timeout_s: float, what: str) -> bytes:
    try:
        store.wait([key], timedelta(seconds=timeout_s))
    except Exception as exc:  # noqa: BLE001  (torch raises DistStoreError / RuntimeError on a timeout)
        raise LaunchError(f"{what} did not report its settings within the rendezvous timeout ({timeout_s:.0f} s; "
                          "node 0 waits there for as many nodes as its --nnodes says): start the same command on "
                          "every node (the same --nnodes, one --node_rank each), or raise --rdzv_timeout") from exc
    return store.get(key)


class SettingsWatcher:
    """Node 0 of a static rendezvous: compares the settings other nodes write while torch's store still waits for
    nodes (started by :meth:`start`; :attr:`problem` is the first difference found, or None)."""

    POLL_S = 0.2

    def __init__(self, host: str, port: int, run_id: str, mine: NodeSettings, timeout_s: float) -> None:
        self._where = (host, port, run_id)
        self._mine = mine
        self._timeout_s = timeout_s
        self._stop = threading.Event()
        self._store: Any = None
        """The store client, connected by the watching thread (or before it starts: :class:`ArrivalWatcher`)."""
        self.problem: str | None = None

    JOIN_S = 5.0

    def start(self) -> "SettingsWatcher":
        self._thread = threading.Thread(target=self._watch, name="mb-node-settings", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching and wait for the thread (it ends within a poll): a thread still inside the store's C++ code
        when the launcher exits would abort the process."""
        self._stop.set()
        self._thread.join(timeout=self.JOIN_S)

    def _watch(self) -> None:
        try:
            store = self._store if self._store is not None else self._connect()
            while not self._stop.is_set() and self.problem is None:
                self._compare(store)
                self._stop.wait(self.POLL_S)
        except Exception:  # noqa: BLE001  (the store went away: the rendezvous itself reports what happened)
            return

    def _connect(self) -> Any:
        from torch.distributed import PrefixStore, TCPStore

        host, port, run_id = self._where
        client = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=self._timeout_s),
                          wait_for_workers=False)
        return PrefixStore(run_id, client)

    def _compare(self, store: Any) -> None:
        for other in range(1, self._mine.nnodes):
            key = f"{PREFIX}{other}"
            if not store.check([key]):
                continue
            problem = difference(0, self._mine, other, NodeSettings.from_json(store.get(key)))
            if problem is not None:
                store.set(f"{PREFIX}0", self._mine.to_json())  # the other nodes compare and stop now
                store.set(VERDICT_KEY, problem)
                self.problem = problem
                return


class ArrivalWatcher(SettingsWatcher):
    """A launcher of a c10d rendezvous: registers its settings under the next arrival number of the rendezvous store
    (:meth:`start`, before it joins) and compares every other arrival's with its own while it waits. Nodes are
    named by host and launcher pid (torch's own node names), as ranks do not exist yet."""

    def __init__(self, host: str, port: int, run_id: str, mine: NodeSettings, timeout_s: float) -> None:
        super().__init__(host, port, run_id, mine, timeout_s)
        self.label = f"{socket.gethostname()} (launcher pid {os.getpid()})"

    def start(self) -> "ArrivalWatcher":
        """Register (raises when the store cannot be reached) and start watching."""
        self._store = self._connect()
        self._arrival = int(self._store.add(ARRIVALS_KEY, 1))
        self._store.set(f"{PREFIX}arrival/{self._arrival}", json.dumps({"label": self.label,
                                                                          **json.loads(self._mine.to_json())}))
        super().start()
        return self

    def _compare(self, store: Any) -> None:
        for other in range(1, int(store.add(ARRIVALS_KEY, 0)) + 1):
            key = f"{PREFIX}arrival/{other}"
            if other == self._arrival or not store.check([key]):
                continue
            theirs = json.loads(store.get(key))
            label = theirs.pop("label", f"arrival {other}")
            problem = difference(self.label, self._mine, label, NodeSettings(**theirs))
            if problem is not None:
                self.problem = problem
                return
