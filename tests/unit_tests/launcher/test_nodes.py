"""The node and restart flags: parsing, checks (named LaunchError), and the per-node torchrun flags."""

import argparse

import pytest

from megatron_bridge.errors import LaunchError
from megatron_bridge.launcher.nodes import (
    NodeLayout,
    add_node_arguments,
    check_node_layout,
    node_layout,
    parse_endpoint,
    processes_per_node,
    torchrun_arguments,
)


def _layout(*argv: str) -> NodeLayout:
    parser = argparse.ArgumentParser()
    add_node_arguments(parser)
    return node_layout(parser.parse_args(list(argv)))


def test_defaults_are_one_local_node_without_restarts() -> None:
    layout = _layout()
    assert layout == NodeLayout()
    assert not layout.multi_node and not layout.needs_launcher(1) and layout.needs_launcher(2)
    assert torchrun_arguments(layout, 2, free_port=4242) == [
        "--nnodes=1", "--nproc_per_node=2", "--max_restarts=0", "--node_rank=0", "--master_addr=127.0.0.1",
        "--master_port=4242", "--rdzv_conf=timeout=600"]


def test_both_spellings_parse() -> None:
    assert _layout("--nnodes", "2", "--node-rank", "1", "--master-addr", "h0", "--master-port", "1234") == \
        _layout("--nnodes=2", "--node_rank=1", "--master_addr=h0", "--master_port=1234")


def test_static_rendezvous_keeps_node_rank() -> None:
    layout = _layout("--nnodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1", "--max_restarts", "3",
                     "--rdzv_timeout", "30")
    assert layout.world_size(4) == 8 and layout.needs_launcher(1)
    assert torchrun_arguments(layout, 4) == [
        "--nnodes=2", "--nproc_per_node=4", "--max_restarts=3", "--node_rank=1", "--master_addr=10.0.0.1",
        "--master_port=29500", "--rdzv_conf=timeout=30"]


def test_rdzv_endpoint_with_node_rank_is_the_static_rendezvous_there() -> None:
    layout = _layout("--nnodes", "2", "--node_rank", "0", "--rdzv_endpoint", "node0:6000")
    assert torchrun_arguments(layout, 1)[3:6] == ["--node_rank=0", "--master_addr=node0", "--master_port=6000"]


def test_rdzv_endpoint_without_node_rank_is_c10d() -> None:
    layout = _layout("--nnodes", "2", "--rdzv_endpoint", "node0:6000", "--rdzv_timeout", "9")
    assert torchrun_arguments(layout, 1)[3:] == ["--rdzv_backend=c10d", "--rdzv_endpoint=node0:6000",
                                                 "--rdzv_id=megatron-bridge", "--rdzv_conf=join_timeout=9"]


@pytest.mark.parametrize(("layout", "words"), [
    (NodeLayout(nnodes=2, node_rank=2, master_addr="a"), "--node_rank 2 with --nnodes 2"),
    (NodeLayout(nnodes=2, node_rank=0), "without a rendezvous"),
    (NodeLayout(nnodes=2, master_addr="a"), "needs --node_rank"),
    (NodeLayout(nnodes=2, node_rank=0, master_addr="a", rdzv_endpoint="a:1"), "both given"),
    (NodeLayout(nnodes=2, node_rank=0, master_port=5), "--master_port without --master_addr"),
    (NodeLayout(nnodes=2, rdzv_endpoint="nohost"), "is not HOST:PORT"),
    (NodeLayout(nnodes=2, rdzv_endpoint="h:99999"), "is not HOST:PORT"),
    (NodeLayout(nnodes=2, rdzv_endpoint="h:1", max_restarts=1), "give --node_rank on every node"),
    (NodeLayout(nnodes=2, node_rank=1, master_addr=" "), "--master_addr is empty"),
])
def test_bad_layouts_are_named(layout: NodeLayout, words: str) -> None:
    with pytest.raises(LaunchError, match=words):
        check_node_layout(layout)


@pytest.mark.parametrize("argv", [["--max_restarts", "-1"], ["--nnodes", "0"], ["--node_rank", "x"],
                                  ["--master_port", "70000"], ["--rdzv_timeout", "0"]])
def test_bad_numbers_are_usage_errors(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    add_node_arguments(parser)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(argv)
    assert exc.value.code == 2


def test_parse_endpoint() -> None:
    assert parse_endpoint("[::1]:80") == ("::1", 80)
    assert parse_endpoint("n1:29500") == ("n1", 29500)


def test_processes_per_node() -> None:
    assert processes_per_node(8, None, 1) == 8
    assert processes_per_node(8, None, 2) == 4
    assert processes_per_node(8, 4, 2) == 4
    with pytest.raises(LaunchError, match="-ng 6 is not a multiple of -gn 4"):
        processes_per_node(6, 4, 2)
    with pytest.raises(LaunchError, match="is 2 node\\(s\\) but --nnodes is 1"):
        processes_per_node(2, 1, 1)
    with pytest.raises(LaunchError, match="must be a multiple of --nnodes"):
        processes_per_node(3, None, 2)


@pytest.mark.parametrize(("script", "argv", "message"), [
    ("scripts/training/run_recipe.py", ["--recipe", "tiny_llama", "--nnodes", "2", "--node_rank", "2",
                                        "--master_addr", "h0"], "error: --node_rank 2 with --nnodes 2"),
    ("scripts/performance/launch.py", ["--recipe", "tiny_llama", "-ng", "3", "-gn", "2"],
     "error: -ng 3 is not a multiple of -gn 2"),
    ("scripts/performance/launch.py", ["--recipe", "tiny_llama", "-ng", "2", "--nnodes", "2", "--node_rank", "0"],
     "error: --nnodes 2 without a rendezvous"),
], ids=["run_recipe-node_rank", "launch-gn", "launch-no-rendezvous"])
def test_scripts_refuse_bad_node_flags_with_one_line(script: str, argv: list[str], message: str) -> None:
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, str(repo / script), *argv], cwd=repo, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and proc.stderr.startswith(message), proc.stderr
