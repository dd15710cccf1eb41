"""Test-only: the functional tests' torchrun agents and workers forked from a warm process instead of started cold.

A cold torchrun launch of 2 ranks starts three interpreters (the agent and two workers) that each import torch, pytest
and the library (and the workers megatron-core): seconds of CPU each, most of the suite's CPU on the 2-core machine.
Here the launching process (launcher.py) starts one *fork server* that imports all of that once (under pytest-xdist, the
controlling process starts it for all its workers: ``share_fork_server``); every launch then runs ``python -m
tests.functional_tests.forkserver MODULE ARGS...`` where it ran ``python -m MODULE ARGS...``: a small client (standard
library only) that asks the server to fork a process running ``MODULE`` as ``__main__`` with the client's arguments,
environment, working directory and standard streams, and then stands in for that process: it forwards the signals it
gets (SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2) to the forked process's group and exits as it did (its exit code, or
killed by the same signal). So ``torch.distributed.run`` still starts, watches and stops its workers itself, each worker
is a process of its own with its own gloo process group, and what a test checks is unchanged; only the imports before
the first line of the test are paid once. pytest-xdist's workers fork from the same server (launcher.py's
``fork_xdist_workers``: execnet starts them as ``python -u -c BOOTSTRAP``).

The launches of the scripts under test (``launch.py``, ``python -m megatron_bridge.launcher.torchrun``: the multi-node,
restart and perf tests) start the scripts and their torchrun agents cold, as users run them, and only their workers
warm: torchrun starts each worker with its ``PYTHON_EXEC`` (launcher.py's ``forked_workers_env``), here
``forked_python``, which runs this client with the interpreter's arguments (``python forkserver.py --python -u SCRIPT
ARGS...``). A script then runs as ``python SCRIPT`` would (``sys.path[0]`` its folder), a module as ``python -m``
would (``sys.path[0]`` the working directory).

The server imports nothing of the tests (they are imported in the forked process, with its environment). A request
runs cold instead (the client ``exec``\\ s ``python -m MODULE ARGS...``, as before) when ``$MB_COLD_START=1``, when
no server is reachable, or when the request's environment differs from the server's in what an interpreter reads
at start-up (:data:`STARTUP_VARS`, e.g. ``PYTHONPATH``). The forked process is in a session of its own; it ends
with SIGKILL when its client is gone (killed); when the client's parent (torchrun's agent) dies, the client sends
it SIGTERM, as the library's parent watch does for a worker (``megatron_bridge.utils.process.watch_parent``).

What differs from a cold start: the forked processes share the server's string-hash seed and the state of Python's
``random`` module (the tests seed what they compare), and the modules of :data:`PRELOAD` were imported with the
server's environment (the launching process's and launcher.py's ``LAUNCH_ENV``), not the launch's own variables.
Their objects are frozen (``gc.freeze``) before the server forks: a forked process's garbage collections skip them,
which saves the CPU of traversing them and of copying the pages a traversal writes to (measured 2026-12-03 on the
2-core VM, a 4-rank CP launch: 17.9 CPU s per worker without, 14.7 with).
"""

import gc
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time


SOCKET_ENV = "MB_FORKSERVER_SOCKET"
"""Path of the fork server's socket, in the environment of the launches that use it (launcher.py sets it)."""
PID_ENV = "MB_FORKSERVER_PID"
"""The fork server's process id (launcher.py sets it): a client stops waiting for a server that has exited."""
COLD_ENV = "MB_COLD_START"
"""``1``: every process starts cold (``python -m MODULE``), e.g. to compare or to debug a start-up."""
PYTHON_ENV = "MB_FORKSERVER_PYTHON"
"""The interpreter that ``forked_python`` (torchrun's ``PYTHON_EXEC`` in launcher.py's ``forked_workers_env``) runs
this client with."""
STARTUP_ENV = "MB_FORKSERVER_STARTUP"
"""A Python file that a forked process runs before its module or script, as a cold interpreter imports a
``sitecustomize`` module it finds on ``PYTHONPATH`` (a different ``PYTHONPATH`` would start the request cold): e.g. the
megatron-core CPU harness's ``tests/functional_tests/mcore_cpu/sitecustomize.py`` for the torchrun workers of a script
under test (mcore_cpu_harness.py's ``workers_env``). Cold processes ignore it."""
LOG_ENV = "MB_FORKSERVER_LOG"
"""A file the launching process's fork server appends its log to (one line per forked process: its end, wall and CPU
seconds, command line); by default a file in the server's temporary folder, removed with it."""
STARTUP_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONSAFEPATH", "PYTHONNOUSERSITE",
                "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS", "PYTHONUNBUFFERED", "LD_PRELOAD", "LD_LIBRARY_PATH",
                "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
"""Environment read when an interpreter or its libraries start: a request whose values differ from the server's
runs cold."""
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
"""Signals a client passes on to the forked process's group."""
PRELOAD = ("torch", "torch.distributed", "torch.distributed.run", "torch.distributed.checkpoint",
           "torch.distributed.fsdp", "torch.distributed.tensor", "torch.optim", "torch._dynamo", "pytest",
           "xdist.plugin", "pytest_timeout", "anyio.pytest_plugin", "megatron_bridge.training.pretrain",
           "megatron_bridge.recipes", "megatron.core", "megatron.core.models.gpt", "megatron.core.distributed",
           "megatron.core.optimizer", "transformers", "torchao.float8", "modelopt.torch.opt",
           "modelopt.torch.quantization", "modelopt.torch.distill")
"""What the server imports before it forks (a missing package is left out); megatron-core after
tests/functional_tests/deferred_compile.py is installed, as in a cold worker (conftest.py). ``torch._dynamo``: torch
imports it at a process's first ``nn.init`` call or optimizer (≈ 1 CPU s in a fresh process; measured 2026-12-03, a
quarter of a CP worker's py-spy samples, and 19.2 -> 16.3 CPU s per worker once preloaded, with
``anyio.pytest_plugin``, a plugin pytest loads at start-up). nvidia-modelopt and torchao: ``validate()`` imports them
(``megatron_bridge.utils.packages.import_problem``) for a config with quantization, distillation or FP8, ≈ 6.5 CPU s
per worker of the QAT and distillation launches (py-spy, 2026-12-04); importing them changes no torch attribute."""
CLIENT_WAIT_S = 120.0
"""How long a client waits for a server that is still importing :data:`PRELOAD`."""
_HEADER = struct.Struct("!Q")


# ----------------------------------------------------------------------------------------------- messages
def _send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    sent = socket.send_fds(sock, [payload], fds) if fds else sock.send(payload)
    if sent < len(payload):
        sock.sendall(payload[sent:])


def _send_quietly(sock: socket.socket, message: dict) -> None:
    """:func:`_send`, ignoring a peer that is gone."""
    try:
        _send(sock, message)
    except OSError:
        pass


def _recv(sock: socket.socket, with_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One message (None: the peer closed the connection first) and the descriptors sent with it.

    Reads exactly one message: the server sends a client two in a row (the forked process's id, then its end, at
    once when it ends at once), and a read past the first would lose the second. Once a message has begun, the rest
    is waited for whatever the socket's timeout (it was sent whole)."""
    if with_fds:
        data, fds, _, _ = socket.recv_fds(sock, _HEADER.size, with_fds)
    else:
        data, fds = sock.recv(_HEADER.size), []
    if not data:
        return None, fds
    timeout = sock.gettimeout()
    sock.settimeout(None)
    try:
        header = _recv_exactly(sock, _HEADER.size, data)
        body = _recv_exactly(sock, _HEADER.unpack(header)[0]) if header is not None else None
    finally:
        sock.settimeout(timeout)
    return (json.loads(body) if body is not None else None), fds


def _recv_exactly(sock: socket.socket, size: int, data: bytes = b"") -> bytes | None:
    """``data`` completed to ``size`` bytes from ``sock``; None if the peer closes first."""
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            return None
        data += more
    return data


def _startup_env(env: dict[str, str]) -> dict[str, str | None]:
    return {name: env.get(name) for name in STARTUP_VARS}


# -------------------------------------------------------------------------------------------------- server
def _preload(modules: tuple[str, ...]) -> None:
    import importlib

    if "torch" in modules:
        import torch  # noqa: F401 (deferred_compile patches torch.compile, before megatron-core decorates with it)

        from tests.functional_tests import deferred_compile

        deferred_compile.install()
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def _threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1


class _Server:
    """Accepts requests on ``path``, forks one process per request, reports each one's end to its client."""

    def __init__(self, path: str, parent: int, broken: str | None) -> None:
        self.broken = broken
        """Why every request runs cold (the preload failed), or None."""
        self.parent = parent
        self.env = _startup_env(dict(os.environ))
        self.selector = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        staging = f"{path}.{os.getpid()}"
        self.listener.bind(staging)
        self.listener.listen(64)
        os.rename(staging, path)  # clients see the socket only once it accepts
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.wake_read, self.wake_write = socket.socketpair()  # SIGCHLD wakes the loop: an end is reported at once
        self.wake_write.setblocking(False)
        signal.set_wakeup_fd(self.wake_write.fileno())
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        self.selector.register(self.wake_read, selectors.EVENT_READ, data="wake")
        self.children: dict[int, tuple[socket.socket, float, str]] = {}
        """Running forked processes: their client's connection, start (monotonic) and command line."""

    def run(self) -> None:
        while os.getppid() == self.parent:
            for key, _ in self.selector.select(timeout=0.2):
                if key.fileobj is self.listener:
                    conn, _ = self.listener.accept()
                    self.selector.register(conn, selectors.EVENT_READ, data=None)
                elif key.data == "wake":
                    self.wake_read.recv(4096)
                elif key.data is None:
                    self._start(key.fileobj)
                else:  # the client of a running process is gone (killed): so is its process
                    self._drop(key.fileobj, key.data)
            self._reap()
        for pid in list(self.children):  # the launching process is gone
            _kill_group(pid, signal.SIGKILL)

    def _start(self, conn: socket.socket) -> None:
        self.selector.unregister(conn)
        try:
            request, fds = _recv(conn, with_fds=3)
        except OSError:
            request, fds = None, []
        try:
            why = self._why_cold(request) if request is not None and len(fds) == 3 else "a broken request"
            if why:
                _send_quietly(conn, {"cold": why})
                conn.close()
                return
            pid = os.fork()
            if pid == 0:
                self._child(conn, request, fds)  # never returns
        finally:
            for fd in fds:
                os.close(fd)
        self.children[pid] = (conn, time.monotonic(), " ".join([_main_of(request), *request["argv"]])[:300])
        self.selector.register(conn, selectors.EVENT_READ, data=pid)
        _send_quietly(conn, {"pid": pid})  # a client gone by now reads as end of file next: its process is killed

    def _why_cold(self, request: dict) -> str | None:
        if self.broken:
            return self.broken
        differs = [n for n, v in _startup_env(request["env"]).items() if v != self.env[n]]
        if differs:
            return f"its start-up environment differs from the fork server's: {differs}"
        if request.get("unbuffered") and not self.env["PYTHONUNBUFFERED"]:
            return "-u asks for unbuffered streams and the fork server's are buffered"
        threads = _threads()
        return f"the fork server runs {threads} threads (it forks only when it runs one)" if threads != 1 else None

    def _child(self, conn: socket.socket, request: dict, fds: list[int]) -> None:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            self.selector.close()
            others = [c for c, _, _ in self.children.values()]
            for other in [self.listener, self.wake_read, self.wake_write, conn, *others]:
                other.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server's only handler (the others are Python's own)
            os.setsid()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            code = _run_main(request)
        finally:
            os._exit(code)

    def _drop(self, conn: socket.socket, pid: int) -> None:
        self.selector.unregister(conn)
        conn.close()
        if self.children.pop(pid, None) is not None:
            print(f"pid {pid}: its client is gone, killing it", flush=True)
            _kill_group(pid, signal.SIGKILL)

    def _reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid not in self.children:  # killed after its client was gone (_drop)
                continue
            conn, started, what = self.children.pop(pid)
            self.selector.unregister(conn)
            end = _describe(status)
            _send_quietly(conn, {"status": end})
            conn.close()
            print(f"pid {pid} {end} after {time.monotonic() - started:.1f} s, "
                  f"{usage.ru_utime + usage.ru_stime:.1f} CPU s: {what}", flush=True)


def _main_of(request: dict) -> str:
    return request.get("module") or request.get("script") or "-c " + request["code"][:60]


def _run_main(request: dict) -> int:
    """Run the request's module as ``python -m MODULE ARGS...`` would (``sys.path[0]``: the working directory), its
    script as ``python SCRIPT ARGS...`` would (``sys.path[0]``: the script's folder), or its code as ``python -c CODE
    ARGS...`` would (``sys.path[0]``: empty, in a fresh ``__main__``), in this process; its exit code."""
    import runpy
    import traceback
    import types

    try:
        if os.environ.get(STARTUP_ENV):
            runpy.run_path(os.environ[STARTUP_ENV], run_name="sitecustomize")
        if request.get("module"):
            sys.argv = [request["module"], *request["argv"]]
            sys.path[0] = os.getcwd()
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        elif request.get("code") is not None:
            sys.argv = ["-c", *request["argv"]]
            sys.path[0] = ""
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(request["code"], "<string>", "exec"), main.__dict__)
        else:
            sys.argv = [request["script"], *request["argv"]]
            sys.path[0] = os.path.dirname(os.path.abspath(request["script"]))
            runpy.run_path(request["script"], run_name="__main__")
        code = 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:  # sys.exit("message"), as the interpreter does: the message on stderr, exit code 1
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _describe(status: int) -> dict[str, int]:
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return {"code": os.WEXITSTATUS(status)}


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _name_frozen_files() -> None:
    """Tell ``inspect`` which module each frozen standard-library file name (``<frozen runpy>``) belongs to.

    torch's elastic agent names every rendezvous event with ``inspect.stack()`` (twice per event), and ``inspect``
    looks a frame's module up by its file name; a frozen module's file name is never in its cache, so each such frame
    (the server's and the forked process's ``runpy`` frames) scanned all of ``sys.modules``: here ≈ 3,100 modules, 70 %
    of a forked agent's CPU time (py-spy, 2026-12-03). These are the names ``inspect`` would find if it could."""
    import inspect

    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.origin == "frozen" and spec.name == name:
            inspect.modulesbyfile.setdefault(f"<frozen {name}>", name)


def serve(path: str, modules: tuple[str, ...] = PRELOAD) -> None:
    """The fork server: import ``modules``, then serve requests on ``path`` until its parent process is gone (if the
    imports fail, every request runs cold, with the reason)."""
    parent = os.getppid()
    try:
        _preload(modules)
        _name_frozen_files()
        gc.collect()
        gc.freeze()  # a forked process's collections skip the preloaded objects (the module docstring says why)
        broken = None
    except BaseException as exc:  # noqa: BLE001 (reported to every client, which then starts cold)
        broken = f"the fork server's imports failed: {exc!r}"
    _Server(path, parent, broken).run()


# -------------------------------------------------------------------------------------------------- client
def _cold(python_args: list[str], why: str | None) -> None:
    """Replace this client by ``python PYTHON_ARGS...``."""
    if why:
        print(f"forkserver: {' '.join(python_args)[:200]} starts cold ({why})", file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, *python_args])


def _python_request(args: list[str]) -> dict | None:
    """The request for the interpreter arguments ``args`` (``[-u] SCRIPT ARGS...`` or ``[-u] -m MODULE ARGS...``,
    what torchrun passes to its ``PYTHON_EXEC``, or ``[-u] -c CODE ARGS...``, what execnet starts pytest-xdist's
    workers with); None for any other option, which then starts cold."""
    unbuffered = False
    for i, arg in enumerate(args):
        if arg == "-u":
            unbuffered = True
        elif arg == "-m" and i + 1 < len(args):
            return {"module": args[i + 1], "argv": args[i + 2:], "unbuffered": unbuffered}
        elif arg == "-c" and i + 1 < len(args):
            return {"code": args[i + 1], "argv": args[i + 2:], "unbuffered": unbuffered}
        elif arg.startswith("-"):
            return None
        else:
            return {"script": arg, "argv": args[i + 1:], "unbuffered": unbuffered}
    return None


def _connect(path: str, server_pid: int | None) -> socket.socket | None:
    deadline = time.monotonic() + CLIENT_WAIT_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except FileNotFoundError:  # still importing, unless it has exited
            sock.close()
            if time.monotonic() > deadline or (server_pid and not os.path.exists(f"/proc/{server_pid}")):
                return None
            time.sleep(0.1)
        except ConnectionRefusedError:  # it was up and is gone
            sock.close()
            return None


def client(python_args: list[str], request: dict | None) -> None:
    """Run ``python PYTHON_ARGS...`` (``request``: what it runs, see :func:`_python_request`) in a process forked by
    the server, or cold when it cannot; exit as it did."""
    path = os.environ.get(SOCKET_ENV)
    if os.environ.get(COLD_ENV) == "1" or not path or request is None:
        _cold(python_args, None if request else "interpreter options the fork server does not take")
    server_pid = os.environ.get(PID_ENV, "")
    sock = _connect(path, int(server_pid) if server_pid.isdigit() else None)
    if sock is None:
        _cold(python_args, f"no fork server at {path}")
    parent = os.getppid()
    request = {**request, "env": dict(os.environ), "cwd": os.getcwd()}
    _send(sock, request, [0, 1, 2])
    reply, _ = _recv(sock)
    if reply is None or "cold" in reply:
        sock.close()
        _cold(python_args, reply["cold"] if reply else "the fork server closed the connection")
    pid = reply["pid"]
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, frame: _kill_group(pid, signum))
    sock.settimeout(0.5)
    while True:
        try:
            end, _ = _recv(sock)
            break
        except TimeoutError:
            if os.getppid() != parent:  # the agent is gone: stop the worker, as its parent watch would
                _kill_group(pid, signal.SIGTERM)
                parent = os.getppid()
    _exit_as((end or {}).get("status", {"code": 1}))


def _exit_as(status: dict[str, int]) -> None:
    if "signal" in status:
        if status["signal"] not in (signal.SIGKILL, signal.SIGSTOP):  # these two have no handler to reset
            signal.signal(status["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])
    sys.exit(status.get("code", 1))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"] and len(sys.argv) in (3, 4):
        serve(sys.argv[2], *([tuple(filter(None, sys.argv[3].split(",")))] if len(sys.argv) == 4 else []))
    elif sys.argv[1:2] == ["--python"]:  # forked_python: python's own arguments
        client(sys.argv[2:], _python_request(sys.argv[2:]))
    elif len(sys.argv) < 2 or sys.argv[1] == "--serve":
        sys.exit("usage: python -m tests.functional_tests.forkserver MODULE [ARGS...] | --python PYTHON_ARGS... | "
                 "--serve SOCKET [MODULE,...]")
    else:  # launcher.py: python -m tests.functional_tests.forkserver MODULE ARGS... runs as python -u -m MODULE ARGS...
        client(["-u", "-m", *sys.argv[1:]], _python_request(["-u", "-m", *sys.argv[1:]]))
