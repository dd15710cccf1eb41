"""Test-only: pytest-xdist's scope scheduling (``--dist loadscope``/``loadgroup``, which ``make test`` uses through
tests/conftest.py) without its end-of-run deadlock after a worker crash.

pytest-xdist 3.8.0 (pinned in requirements/cpu.txt) hangs for good once a worker has crashed (a segfault, the
kernel's OOM killer, ``os._exit`` in a test): the run stops a few tests before its end and never reports again, so CI
ends at its time limit instead of naming the crashed test (a CI run of this suite: 4 tests short of the end, killed
after 90 minutes). Two faults, both reported upstream (pytest-xdist issues 1323, 1327, 1378):

* ``remove_node`` puts the crashed worker's whole workload back on the queue, the units it had completed too. Each
  is later sent to a worker as an empty list of tests, which never completes, so that worker is never given more
  work nor told to shut down.
* A worker runs a test only once it knows the next one (or is told to shut down), and a worker is given one unit per
  completed test: one given a lone test when the queue runs out waits for a next one that never comes (issue 1327;
  not reproduced here with xdist's own ``remove_node``, but reachable once the crashed test is dropped from a unit,
  as below, and its unit has one test left).

:func:`crash_safe_scope_scheduling` returns xdist's ``LoadScopeScheduling`` with both mended: only the unfinished
tests of the crashed worker's units go back on the queue, without the test it crashed on (xdist has reported that one
as failed, "worker 'gwN' crashed while running ..."; running it again would crash the replacement too); a worker is
given units until it holds at least two tests, and is told to shut down as soon as the queue is empty. A worker
that crashed right after reporting a test is still given work when that report is handled (xdist learns of the crash
later): the send fails, the unit stays with it, and ``remove_node`` queues it again (seen once in a full run:
``OSError: cannot send (already closed?)`` ended the run). Test:
tests/unit_tests/env/test_xdist_recovery.py. xdist is imported only when the class is made (a torchrun worker's
pytest never schedules).
"""

from typing import Any


MIN_QUEUED = 2
"""A worker holds at least this many tests while work is left: it runs one only once it knows the next."""


def crash_safe_scope_scheduling() -> type:
    """xdist's ``LoadScopeScheduling`` that recovers from a crashed worker (the module docstring says how)."""
    from xdist.scheduler import LoadScopeScheduling

    class CrashSafeScopeScheduling(LoadScopeScheduling):
        """``LoadScopeScheduling`` whose run ends after a worker crash (tests/xdist_recovery.py)."""

        def remove_node(self, node: Any) -> str | None:
            workload = self.assigned_work.pop(node)
            pending = {scope: unit for scope, unit in workload.items() if not all(unit.values())}
            if not pending:  # a worker that finished (or crashed after its last test was reported)
                return None
            unit = next(iter(pending.values()))
            crashed = next(nodeid for nodeid, done in unit.items() if not done)  # a worker runs its tests in order
            unit[crashed] = True  # reported as failed by xdist; not run again
            self.workqueue.update({s: u for s, u in pending.items() if not all(u.values())})
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

        def _reschedule(self, node: Any) -> None:
            if node.shutting_down:
                return
            try:
                if self.workqueue and self._pending_of(self.assigned_work[node]) <= MIN_QUEUED:
                    self._assign_work_unit(node)  # one unit, as xdist does ...
                while self.workqueue and self._pending_of(self.assigned_work[node]) < MIN_QUEUED:
                    self._assign_work_unit(node)  # ... and more while the worker could not start its last test
            except OSError:  # its channel closed: it crashed after its last report, which is handled before the crash
                return  # the unit stays assigned to it; remove_node puts it back on the queue
            if not self.workqueue:
                node.shutdown()  # queued after its tests: it runs them all, then stops

    return CrashSafeScopeScheduling
