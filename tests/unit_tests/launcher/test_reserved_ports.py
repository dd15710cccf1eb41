"""megatron_bridge.utils.launch.reserved_ports: a free port stays the job's until the job ends.

A port found free and released was taken by another process before torchrun's agent bound it (a CI run: "node 0
cannot host the rendezvous store ...: the port is in use"). A reserved port is refused to everybody but a server
that binds it with ``SO_REUSEADDR`` (torch's TCPStore, Slurm's daemons).
"""

import errno
import socket
from datetime import timedelta

import pytest

from megatron_bridge.launcher.local import relaunch_with_torchrun
from megatron_bridge.utils.launch import reserved_port, reserved_ports


def _plain_bind_error(port: int) -> int | None:
    """The errno of binding ``port`` without SO_REUSEADDR (what any other program does), None if it worked."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.errno
    return None


def test_reserved_ports_are_distinct_and_refused_to_others_until_the_block_ends() -> None:
    with reserved_ports(3) as ports:
        assert len(set(ports)) == 3 and all(1024 < p < 65536 for p in ports)
        assert [_plain_bind_error(p) for p in ports] == [errno.EADDRINUSE] * 3
        handed_out = set()
        for _ in range(500):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                handed_out.add(s.getsockname()[1])
        assert not handed_out & set(ports)


def test_torch_store_hosts_on_a_reserved_port() -> None:
    import torch.distributed as dist

    with reserved_port() as port:
        for libuv in (True, False):  # both of TCPStore's servers set SO_REUSEADDR
            store = dist.TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=10), use_libuv=libuv)
            store.set("key", "value")
            assert store.get("key") == b"value" and store.port == port
            del store


def test_a_relaunch_holds_its_port_while_the_job_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int | None]] = []

    def job(cmd: list[str], env: dict[str, str]) -> int:  # instead of torchrun: look at the port it was given
        (flag,) = [a for a in cmd if a.startswith("--master_port=")]
        port = int(flag.split("=")[1])
        seen.append((port, _plain_bind_error(port)))
        return 0

    monkeypatch.setattr("megatron_bridge.utils.process.run_job", job)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert relaunch_with_torchrun(2, argv=["train.py"]) == 0
    ((port, error),) = seen
    assert error == errno.EADDRINUSE
