"""tests/functional_tests/launcher.py: what a failed launch reports. A rank that crashes leaves Python's crash report
(faulthandler) far above torchrun's failure summary; the failure quotes it, the crashed thread first. A test the
launch ended in the middle of says so."""

import os
import subprocess
import sys

from tests.functional_tests.launcher import FATAL_FRAMES, _outcome, fatal_errors


CRASH = """
import ctypes, os, threading, time
if os.environ.get("MB_TEST_TORCH_STACKS"):
    import torch
    torch._C._set_print_stack_traces_on_fatal_signal(True)  # as tests/functional_tests/conftest.py does in workers
def idle_worker():
    time.sleep(60)
threading.Thread(target=idle_worker, daemon=True).start()
time.sleep(0.2)
def deep(n):
    return deep(n - 1) if n else ctypes.string_at(0)
def crash_here():
    deep(30)
crash_here()
"""


def _crash_output(torch_stacks: bool = False) -> str:
    env = {**os.environ, "MB_TEST_TORCH_STACKS": "1" if torch_stacks else ""}
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", CRASH], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode < 0, proc.stderr
    return "rank 0 said something\n" + proc.stderr + "torchrun's failure summary\n" * 200


def test_fatal_errors_quote_the_crashed_thread_first_and_whole() -> None:
    report = fatal_errors(_crash_output())
    assert report.startswith("crash report(s)")
    assert "Fatal Python error: Segmentation fault" in report
    current, other = report.index("Current thread"), report.index("\nThread 0x")
    assert current < other  # the crashed thread first, though faulthandler printed it last
    crashed = report[current:other]
    assert "in crash_here" in crashed and crashed.count("in deep") == 31  # whole: every frame
    idle = report[other:]
    assert "in idle_worker" in idle and "Extension modules" not in report and "failure summary" not in report


def test_fatal_errors_quote_the_crashed_threads_cpp_stack_first() -> None:
    """With torch's fatal-signal handler on (the workers'), every thread's C++ stack precedes Python's report: the
    crashed thread's comes first, the others' are left out."""
    output = _crash_output(torch_stacks=True)
    assert output.count("SIGSEGV(11), PID:") >= 2  # the crashed thread and the idle one
    report = fatal_errors(output)
    cpp, python = report.index("(C++, the crashed thread)"), report.index("Fatal Python error: Segmentation fault")
    assert cpp < python and report.count("(C++, the crashed thread)") == 1
    crashed = report[cpp:python]
    assert "fatalSignalHandler" in crashed and "_ctypes" in crashed  # the handler, below it the crashing call
    assert "nanosleep" not in crashed  # the idle thread's stack is not quoted


def test_fatal_errors_keep_the_innermost_frames_of_other_threads() -> None:
    output = "Fatal Python error: Aborted\n\nThread 0x00007f01 (most recent call first):\n" + "".join(
        f'  File "x.py", line {i} in f{i}\n' for i in range(40)) + "\nCurrent thread 0x00007f02 (most recent call " \
        "first):\n  File \"y.py\", line 1 in g\n\nExtension modules: torch._C (total: 1)\n"
    report = fatal_errors(output)
    assert "in f0\n" in report and f"in f{FATAL_FRAMES - 1}\n" in report and f"in f{FATAL_FRAMES}\n" not in report
    assert f"{40 - FATAL_FRAMES} outer frames" in report


def test_fatal_errors_is_empty_without_a_crash() -> None:
    assert fatal_errors("E1203 worker failed (exitcode: 1)\nTraceback (most recent call last):\n") == ""


def test_a_test_the_launch_ended_in_says_so() -> None:
    reports = {0: [{"nodeid": "t1", "when": "setup", "outcome": "passed", "detail": ""}], 1: []}
    outcome = _outcome("t1", reports, "the launch exited with code 1")
    assert outcome.status == "not run"
    assert "no result from rank(s) [0, 1] (the launch ended during this test on rank(s) [0])" in outcome.detail
    assert "ended during" not in _outcome("t2", reports, "the launch exited").detail
