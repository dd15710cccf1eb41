"""The parent watch of a worker and the signal-forwarding job runner (the functional no-orphan tests use them
through run_recipe.py and torchrun)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from megatron_bridge.utils.process import run_job, set_parent_death_signal, watch_parent


def test_watch_parent_only_under_a_launcher(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert watch_parent() is False


def test_orphaned_worker_stops(tmp_path):
    """A child that watches its parent ends soon after the parent is SIGKILLed."""
    marker = tmp_path / "child.pid"
    child = textwrap.dedent(f"""
        import os, time
        os.environ["LOCAL_WORLD_SIZE"] = "1"
        from megatron_bridge.utils.process import watch_parent
        assert watch_parent(poll_s=0.1, grace_s=2.0)
        tmp = {str(marker)!r} + ".tmp"
        open(tmp, "w").write(str(os.getpid()))
        os.replace(tmp, {str(marker)!r})
        time.sleep(120)
    """)
    parent_code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(120)"
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:
        deadline = time.monotonic() + 180  # a loaded machine starts Python slowly
        while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        pid = int(marker.read_text())
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
            try:
                state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:
                break
            if state == "Z":
                break
            time.sleep(0.1)
        else:
            if os.path.exists(f"/proc/{pid}"):
                os.kill(pid, signal.SIGKILL)
                raise AssertionError("the orphaned child kept running")
    finally:
        parent.kill()


def test_run_job_returns_the_exit_code_and_forwards_signals(tmp_path):
    assert run_job([sys.executable, "-c", "raise SystemExit(7)"]) == 7
    ready = tmp_path / "ready"
    code = ("import signal, sys, time, pathlib; signal.signal(signal.SIGTERM, lambda *a: sys.exit(42)); "
            f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)")
    runner = (f"import sys; from megatron_bridge.utils.process import run_job; "
              f"sys.exit(run_job([sys.executable, '-c', {code!r}]))")
    proc = subprocess.Popen([sys.executable, "-c", runner])
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 42  # the job got the SIGTERM and its exit code came back


def test_parent_death_signal_is_available_on_linux():
    assert set_parent_death_signal(0) is (sys.platform.startswith("linux"))  # 0 clears it again
