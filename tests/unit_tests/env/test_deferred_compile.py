"""tests/functional_tests/deferred_compile.py: ``torch.compile(fn)`` sets up nothing until the first call, then
compiles with the options it was given; modules are compiled at once. Run in a fresh interpreter: ``install`` replaces
``torch.compile`` process-wide."""

import subprocess
import sys

from tests.functional_tests.launcher import REPO_ROOT


_PROGRAM = """
import sys
import torch
from tests.functional_tests import deferred_compile

deferred_compile.install()
deferred_compile.install()  # idempotent: still one wrapper around the original

def double(x):
    return 2 * x

compiled = torch.compile(double, backend="eager")
decorated = torch.compile(backend="eager")(double)
assert "torch._dynamo" not in sys.modules, "torch.compile set dynamo up before the first call"
assert compiled.__name__ == "double"
x = torch.arange(3.0)
assert torch.equal(compiled(x), 2 * x) and torch.equal(decorated(x), 2 * x)
assert "torch._dynamo" in sys.modules  # the first call compiled
counters = torch._dynamo.utils.counters["stats"]["calls_captured"]
assert counters > 0, "the call did not go through dynamo"
module = torch.compile(torch.nn.Linear(2, 2), backend="eager")
assert isinstance(module, torch._dynamo.eval_frame.OptimizedModule)
print("ok")
"""


def test_compile_is_set_up_at_the_first_call_with_its_options() -> None:
    proc = subprocess.run([sys.executable, "-c", _PROGRAM], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr[-3000:]
