"""tests/functional_tests/forkserver.py: a process forked by the fork server runs as ``python -m MODULE`` would (or,
through ``forked_python``, torchrun's ``PYTHON_EXEC``, as ``python [-u] SCRIPT``), with the client's arguments,
environment, working directory and streams; its client exits as it did, forwards signals, and takes it along when
killed; what cannot fork warm starts cold; a start-up file runs first where asked. A forked process finds the
server's objects frozen (``gc.freeze``) and ``inspect`` told the frozen standard-library file names' modules. The
server here imports only ``json`` (the launches' server imports torch and the library: launcher.py)."""

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.functional_tests import forkserver
from tests.functional_tests.launcher import FORKED_PYTHON, REPO_ROOT


PROGRAM = """
import gc, inspect, os, signal, sys, time
print("argv", sys.argv[1:], "env", os.environ.get("MB_FS_VALUE"), "cwd", os.getcwd(), "pid", os.getpid(),
      "path0", sys.path[0], "name", __name__, "frozen", gc.get_freeze_count(),
      "runpy", getattr(inspect.getmodule(None, "<frozen runpy>"), "__name__", None), flush=True)
print("on stderr", file=sys.stderr, flush=True)
mode = os.environ.get("MB_FS_MODE", "")
if mode == "term":
    signal.signal(signal.SIGTERM, lambda *a: (print("got SIGTERM", flush=True), os._exit(7)))
    print("ready", flush=True)
    time.sleep(60)
if mode == "sleep":
    print("ready", flush=True)
    time.sleep(60)
if mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(int(os.environ.get("MB_FS_CODE", "0")))
"""


@pytest.fixture
def program(tmp_path: Path) -> Path:
    (tmp_path / "fs_program.py").write_text(PROGRAM)
    return tmp_path


@pytest.fixture
def server(program: Path) -> Iterator[dict[str, str]]:
    """A fork server importing only json; the environment of its clients."""
    path = str(program / "socket")
    env = {**os.environ, "PYTHONPATH": f"{program}{os.pathsep}{REPO_ROOT}", "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tests.functional_tests.forkserver", "--serve", path, "json"],
                            cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL)
    yield {**env, forkserver.SOCKET_ENV: path}
    proc.kill()
    proc.wait()


def _client(env: dict[str, str], *args: str, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.functional_tests.forkserver", "fs_program", *args],
                            cwd="/", env={**env, **extra}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (ProcessLookupError, FileNotFoundError):  # gone, also between the two looks
        return False


def test_forked_process_gets_arguments_environment_directory_streams_and_exit_code(server: dict[str, str]) -> None:
    proc = _client(server, "a", "b c", MB_FS_VALUE="x", MB_FS_CODE="3")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert "argv ['a', 'b c'] env x cwd /" in out
    pid = int(out.split("pid ")[1].split()[0])
    assert pid != proc.pid  # it ran in the forked process, not in the client
    assert "on stderr" in err and "starts cold" not in err
    cold, _ = _client(server, **{forkserver.COLD_ENV: "1"}).communicate(timeout=60)
    frozen = [int(text.split("frozen ")[1].split()[0]) for text in (out, cold)]
    assert frozen[0] > frozen[1] + 1000  # the server's objects, out of the forked process's collections
    # inspect finds the module of a frozen file name without scanning sys.modules (forkserver._name_frozen_files)
    assert "runpy runpy" in out and "runpy None" in cold


def test_a_forked_process_runs_the_startup_file_first(server: dict[str, str], tmp_path: Path) -> None:
    """``$MB_FORKSERVER_STARTUP`` runs in the forked process before its module, as a ``sitecustomize`` would."""
    startup = tmp_path / "startup.py"
    startup.write_text("import os\nos.environ['MB_FS_VALUE'] = 'set by ' + __name__\n")
    out, _ = _client(server, **{forkserver.STARTUP_ENV: str(startup)}).communicate(timeout=60)
    assert "env set by sitecustomize" in out
    cold_env = {forkserver.STARTUP_ENV: str(startup), forkserver.COLD_ENV: "1"}
    cold, _ = _client(server, **cold_env).communicate(timeout=60)
    assert "env None" in cold  # a cold process ignores it (it finds a sitecustomize on PYTHONPATH instead)


def test_a_process_killed_by_a_signal_ends_its_client_by_that_signal(server: dict[str, str]) -> None:
    proc = _client(server, MB_FS_MODE="kill")
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def test_the_client_forwards_sigterm(server: dict[str, str]) -> None:
    proc = _client(server, MB_FS_MODE="term")
    assert proc.stdout is not None
    while "ready" not in (line := proc.stdout.readline()):
        assert line, proc.stderr.read() if proc.stderr else ""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert "got SIGTERM" in out and proc.returncode == 7


def test_killing_the_client_kills_the_forked_process(server: dict[str, str]) -> None:
    proc = _client(server, MB_FS_MODE="sleep")
    assert proc.stdout is not None
    pid = int(proc.stdout.readline().split("pid ")[1].split()[0])
    assert proc.stdout.readline().strip() == "ready"
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def test_a_different_start_up_environment_starts_cold(server: dict[str, str], program: Path) -> None:
    proc = _client(server, "z", MB_FS_CODE="4", PYTHONPATH=f"{program}{os.pathsep}{REPO_ROOT}{os.pathsep}/nonexistent")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 4 and "argv ['z']" in out
    assert "starts cold (its start-up environment differs from the fork server's: ['PYTHONPATH'])" in err
    assert int(out.split("pid ")[1].split()[0]) == proc.pid  # exec'd in the client itself


def test_without_a_server_or_with_cold_start_asked_the_client_runs_the_module_itself(program: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{program}{os.pathsep}{REPO_ROOT}"}
    gone = program / "gone"
    with socket.socket(socket.AF_UNIX) as dead:  # a socket file nobody listens on any more
        dead.bind(str(gone))
    for extra in ({forkserver.COLD_ENV: "1", forkserver.SOCKET_ENV: str(program / "none")},
                  {forkserver.SOCKET_ENV: str(gone)}):
        proc = _client(env, MB_FS_CODE="5", **extra)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 5 and int(out.split("pid ")[1].split()[0]) == proc.pid, err


def test_the_server_ends_with_its_parent(program: Path) -> None:
    path = str(program / "socket")
    code = (f"import os, subprocess, sys, time; p = subprocess.Popen([sys.executable, '-m', "
            f"'tests.functional_tests.forkserver', '--serve', {path!r}, 'json'], stdout=subprocess.DEVNULL); "
            f"[time.sleep(0.1) for _ in range(600) if not os.path.exists({path!r})]; print(p.pid, flush=True)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    server_pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 30
    while _alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(server_pid)


def test_a_client_stops_waiting_for_a_server_that_has_exited(program: Path) -> None:
    """A server that ended before it listened (e.g. killed while importing): the client starts cold at once."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    env = {**os.environ, "PYTHONPATH": f"{program}{os.pathsep}{REPO_ROOT}",
           forkserver.SOCKET_ENV: str(program / "never"), forkserver.PID_ENV: gone.stdout.strip()}
    started = time.monotonic()
    proc = _client(env, MB_FS_CODE="6")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 6 and "starts cold (no fork server at" in err
    assert time.monotonic() - started < forkserver.CLIENT_WAIT_S / 2


def _python(env: dict[str, str], *python_args: str) -> tuple[int, str, str, int]:
    """``forked_python PYTHON_ARGS...``, as torchrun runs its ``PYTHON_EXEC``: exit code, stdout, stderr, client pid."""
    proc = subprocess.Popen([str(FORKED_PYTHON), *python_args], cwd="/", stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**env, forkserver.PYTHON_ENV: sys.executable})
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err, proc.pid


def _pid(out: str) -> int:
    return int(out.split("pid ")[1].split()[0])


def test_forked_python_runs_a_script_or_a_module_as_the_interpreter_would(server: dict[str, str],
                                                                          program: Path) -> None:
    code, out, err, client = _python({**server, "MB_FS_CODE": "8"}, "-u", str(program / "fs_program.py"), "a", "-m")
    assert code == 8 and "argv ['a', '-m'] env None cwd / pid" in out and "starts cold" not in err, err
    assert f"path0 {program} name __main__" in out  # sys.path[0]: the script's folder
    assert _pid(out) != client  # forked, not run in the client
    code, out, err, client = _python({**server, "MB_FS_CODE": "9"}, "-u", "-m", "fs_program", "b")
    assert code == 9 and "argv ['b'] env None cwd / pid" in out and "starts cold" not in err, err
    assert "path0 / name __main__" in out and _pid(out) != client  # sys.path[0]: the working directory
    # -c CODE, as execnet starts pytest-xdist's workers (launcher.py's fork_xdist_workers): a fresh __main__
    program_code = f"import os; os.chdir({str(program)!r}); exec(open('fs_program.py').read())"
    code, out, err, client = _python({**server, "MB_FS_CODE": "6"}, "-u", "-c", program_code, "c")
    assert code == 6 and "argv ['c'] env None" in out and "starts cold" not in err, err
    assert "path0  name __main__" in out and _pid(out) != client  # sys.path[0]: empty, as for python -c


def test_forked_python_starts_cold_for_interpreter_options_it_does_not_take(server: dict[str, str],
                                                                              program: Path) -> None:
    code, out, err, client = _python({**server, "MB_FS_CODE": "10"}, "-X", "utf8", str(program / "fs_program.py"))
    assert code == 10 and "starts cold (interpreter options the fork server does not take)" in err
    assert _pid(out) == client  # exec'd in the client itself


def test_workers_use_the_fork_server_their_parent_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    """launcher.py's share_fork_server (conftest.py, in pytest-xdist's controlling process): its workers' launches
    fork from that one server while it lives, and start cold once it is gone."""
    from tests.functional_tests import launcher

    monkeypatch.setattr(launcher, "_FORK_SERVER", [])  # this process started none of its own
    monkeypatch.delenv(forkserver.COLD_ENV, raising=False)
    pid = str(os.getpid())  # a live process
    monkeypatch.setenv(launcher.SHARED_SERVER_ENV, f"/tmp/x:y/socket:{pid}")
    assert launcher.fork_server_env() == {forkserver.SOCKET_ENV: "/tmp/x:y/socket", forkserver.PID_ENV: pid}
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    monkeypatch.setenv(launcher.SHARED_SERVER_ENV, f"/tmp/x/socket:{gone.stdout.strip()}")
    assert launcher.fork_server_env() == {}
    assert launcher._FORK_SERVER == []  # a worker never starts a server of its own beside the shared one


def test_two_messages_sent_back_to_back_are_read_one_at_a_time() -> None:
    """A process that ends at once: the server sends its id and its end together, and the client reads them apart
    (a client that read past the first message failed on "Extra data", a fresh-clone run of the docs' blocks)."""
    server_end, client_end = socket.socketpair()
    with server_end, client_end, open(os.devnull) as null:
        forkserver._send(server_end, {"pid": 12345})
        forkserver._send(server_end, {"status": {"code": 0}})
        client_end.settimeout(0.5)  # as the client waits for the end
        assert forkserver._recv(client_end) == ({"pid": 12345}, [])
        assert forkserver._recv(client_end) == ({"status": {"code": 0}}, [])
        forkserver._send(client_end, {"argv": ["a"]}, [null.fileno()])
        forkserver._send(client_end, {"argv": ["b"]})
        message, fds = forkserver._recv(server_end, with_fds=3)
        assert message == {"argv": ["a"]} and len(fds) == 1
        os.close(fds[0])
        assert forkserver._recv(server_end, with_fds=3) == ({"argv": ["b"]}, [])
        server_end.close()
        assert forkserver._recv(client_end) == (None, [])  # the peer closed first
