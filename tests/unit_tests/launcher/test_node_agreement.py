"""The nodes of a job agree on --nnodes, --nproc_per_node and --max_restarts before any worker starts: a difference
is one named error on every node (launcher/node_agreement.py); two launchers on one machine run this for real in
tests/functional_tests/multinode. Here: the exchange over an in-process store, one thread per node."""

import threading

import pytest

from megatron_bridge.errors import LaunchError
from megatron_bridge.launcher.node_agreement import NodeSettings, agree


def _run_nodes(settings: list[NodeSettings], timeout_s: float = 5.0, store=None) -> list[str | None]:  # noqa: ANN001
    """Each node's error message (None: agreed)."""
    from torch.distributed import HashStore

    store, errors = store or HashStore(), [None] * len(settings)

    def node(rank: int) -> None:
        try:
            agree(store, rank, settings[rank], timeout_s)
        except LaunchError as exc:
            errors[rank] = str(exc)

    threads = [threading.Thread(target=node, args=(r,)) for r in range(len(settings))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return errors


def test_same_settings_agree() -> None:
    from torch.distributed import HashStore

    store = HashStore()
    assert _run_nodes([NodeSettings(3, 2, 1)] * 3, store=store) == [None, None, None]
    assert _run_nodes([NodeSettings(3, 2, 1)] * 3, store=store) == [None, None, None]  # the verdict of before: "ok"


@pytest.mark.parametrize(("other", "flag"), [(NodeSettings(3, 1, 0), "--nnodes 3 on node 1 but 2 on node 0"),
                                              (NodeSettings(2, 2, 0), "--nproc_per_node 2 on node 1 but 1 on node 0"),
                                              (NodeSettings(2, 1, 1), "--max_restarts 1 on node 1 but 0 on node 0")])
def test_a_difference_is_named_on_every_node(other: NodeSettings, flag: str) -> None:
    errors = _run_nodes([NodeSettings(2, 1, 0), other])
    assert errors[1] is not None and flag in errors[1]
    assert errors[0] is not None and "different settings" in errors[0] and "on node 0 but" in errors[0]


def test_a_third_nodes_difference_reaches_the_second() -> None:
    errors = _run_nodes([NodeSettings(3, 1, 0), NodeSettings(3, 1, 0), NodeSettings(3, 2, 0)])
    assert all(e is not None and "--nproc_per_node" in e for e in errors), errors


def test_a_node_that_never_reports_is_named_within_the_timeout() -> None:
    from torch.distributed import HashStore

    with pytest.raises(LaunchError, match="node 1 did not report its settings within the rendezvous timeout"):
        agree(HashStore(), 0, NodeSettings(2, 1, 0), timeout_s=0.5)


NODE0 = NodeSettings(3, 1, 0)


def _watched(node1: NodeSettings, node0: NodeSettings = NODE0) -> tuple[str | None, str | None]:
    """Node 0's store (a real TCPStore server, as torch's static rendezvous makes it) while node 0 still waits for its
    nodes: node 1 writes ``node1`` and runs its side of the agreement. (node 0's watcher problem, node 1's error)."""
    from datetime import timedelta

    from torch.distributed import PrefixStore, TCPStore

    from megatron_bridge.launcher.node_agreement import SettingsWatcher
    from megatron_bridge.utils.launch import reserved_port

    with reserved_port() as port:
        server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
        watcher = SettingsWatcher("127.0.0.1", port, "run", node0, timeout_s=10).start()
        node1_store = PrefixStore("run", TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10)))
        error = None
        try:
            agree(node1_store, 1, node1, timeout_s=3)
        except LaunchError as exc:
            error = str(exc)
        watcher.stop()
        del server
    return watcher.problem, error


def test_node_zero_waiting_for_more_nodes_names_the_difference() -> None:
    """Node 0 started with --nnodes 3, node 1 with 2: torch's store on node 0 waits for a third node, so the agreement
    cannot run there yet; the watcher finds the difference and node 1 stops at once naming it."""
    problem, error = _watched(NodeSettings(2, 1, 0))
    assert problem == ("the nodes of this job were started with different settings: --nnodes 3 on node 0 but 2 on "
                       "node 1; start every node with the same --nnodes (only --node_rank differs)")
    assert error is not None and error.startswith("the nodes of this job were started with different settings: "
                                                  "--nnodes 2 on node 1 but 3 on node 0")


def test_the_watcher_leaves_agreeing_nodes_alone() -> None:
    """Same settings: no problem, and node 1 waits for node 0's own agreement (here: never comes, so it times out)."""
    problem, error = _watched(NodeSettings(3, 1, 0))
    assert problem is None
    assert error is not None and error.startswith("node 0 did not report its settings")


def _arrivals(first: NodeSettings, second: NodeSettings) -> list[str | None]:
    """Two launchers of a c10d rendezvous that has not completed, on a real TCPStore server: each registers its
    settings and watches the other's (the problems each watcher found)."""
    import time
    from datetime import timedelta

    from torch.distributed import TCPStore

    from megatron_bridge.launcher.node_agreement import ArrivalWatcher
    from megatron_bridge.utils.launch import reserved_port

    with reserved_port() as port:
        server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
        watchers = [ArrivalWatcher("127.0.0.1", port, "run", settings, timeout_s=10).start()
                    for settings in (first, second)]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and first != second and any(w.problem is None for w in watchers):
            time.sleep(0.05)
        if first == second:
            time.sleep(3 * ArrivalWatcher.POLL_S)  # several polls that must find nothing
        for watcher in watchers:
            watcher.stop()
        del server
    return [watcher.problem for watcher in watchers]


def test_c10d_launchers_name_a_difference_before_the_rendezvous_completes() -> None:
    """--nnodes 3 and 2 under c10d: the rendezvous never completes when the node asking for 3 joins last, so each
    launcher's watcher names the flag and both nodes (by host and launcher pid) for when its wait ends."""
    import os

    first, second = _arrivals(NodeSettings(3, 1, 0), NodeSettings(2, 1, 0))
    me = f"(launcher pid {os.getpid()})"  # both watchers live in this test's process
    assert first is not None and first.startswith("the nodes of this job were started with different settings: "
                                                  "--nnodes 3 on node ") and f"{me} but 2 on node " in first
    assert second is not None and "--nnodes 2 on node " in second and f"{me} but 3 on node " in second


def test_c10d_launchers_that_agree_find_nothing() -> None:
    assert _arrivals(NodeSettings(2, 1, 0), NodeSettings(2, 1, 0)) == [None, None]
