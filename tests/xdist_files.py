"""The suite's pytest-xdist scheduler: ``--dist loadfile`` that survives a worker that dies.

When a worker process dies mid-test (killed for memory, a fault in native code), pytest-xdist
reports the test it was running as failed and starts a replacement worker. Its file scheduler
(``LoadFileScheduling``, pytest-xdist 3.8) can then wait for ever, for two reasons:

- it puts the dead worker's whole workload back on the queue, finished files and tests included,
  and a file whose tests are all finished is sent as an empty batch that never completes;
- a worker runs a test only once it has the next one (pytest's teardown needs it), so a
  replacement given a one-test file, with nothing left to send after it, waits for a second
  test or a shutdown that never comes.

This scheduler puts back only the tests that never ran, gives a worker at least two tests while
any are left, and shuts it down as soon as the queue is empty rather than at its next finished
test. The test a worker died in runs once more, on a new worker, with a line in the log saying
so (a machine's hiccup, say the kernel's out-of-memory killer picking a worker, is not the
test's failure); if that worker dies too, the test fails, named, and is not run a third time.
Either way the run goes on to its end. ``tests/conftest.py`` installs it; ``-p xdist_files``
installs it in any pytest run that has ``tests/`` on its path.
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadFileScheduling


class CrashSafeLoadFile(LoadFileScheduling):
    """``--dist loadfile``, with a dead worker's unfinished tests sent to the live ones."""

    def __init__(self, config, log=None):
        super().__init__(config, log)
        self.deaths: dict[str, int] = {}                  # test id: workers it was running in

    def remove_node(self, node):
        workload = self.assigned_work.pop(node)
        pending = [(scope, nodeid) for scope, unit in workload.items()
                   for nodeid, done in unit.items() if not done]
        if not pending:                                   # a worker that ended normally
            return None
        crashed = pending[0][1]                           # a worker runs its tests in order
        self.deaths[crashed] = self.deaths.get(crashed, 0) + 1
        again = self.deaths[crashed] == 1
        units: dict[str, dict[str, bool]] = {}
        for scope, nodeid in pending if again else pending[1:]:
            units.setdefault(scope, {})[nodeid] = False
        for scope in reversed(units):                     # resumed, in order, before new files
            self.workqueue[scope] = units[scope]
            self.workqueue.move_to_end(scope, last=False)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if again and reporter is not None:
            reporter.write_line(f"worker {node.gateway.id} died running {crashed}: it runs once "
                                "more on a new worker, and fails if that one dies too")
        for other in self.assigned_work:
            self._reschedule(other)
        return None if again else crashed

    def _reschedule(self, node):
        super()._reschedule(node)
        while (not node.shutting_down and self.workqueue
               and self._pending_of(self.assigned_work[node]) < 2):
            self._assign_work_unit(node)     # a worker runs a test once it holds the next one
        if not self.workqueue and not node.shutting_down:
            node.shutdown()                  # ... or knows there is none


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """The crash-safe scheduler for ``--dist loadfile``; xdist's own for any other mode."""
    if config.getvalue("dist") == "loadfile":
        return CrashSafeLoadFile(config, log)
    return None
