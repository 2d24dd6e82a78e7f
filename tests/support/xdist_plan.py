"""How CI runs the suite on two processes (pytest-xdist; installer/run-tests.sh passes
``-n 2 --dist loadgroup --no-loadscope-reorder``), loaded by tests/conftest.py as a plugin. docs/TESTING.md
"Two workers" says how to write a test that fits.

- Groups. The unit xdist hands a worker is a group of tests, run there in order: a test's own
  ``@pytest.mark.xdist_group("name")`` (to share something expensive with tests of other modules), else its
  folder's for a folder of ``ONE_WORKER_FOLDERS`` (tests sharing state outside pytest's per-worker temporary
  folders: a virtualenv in ~/.cache, a folder of screenshots), else its module's (a module-scoped fixture is built
  once). Session fixtures are built once per worker that needs them (at most twice in all).
- Order. Groups holding a test marked ``slow`` start first, the costliest first (``slow(seconds=N)``: about N
  seconds on the 2-core CI machine, for the test or, as a module's ``pytestmark``, for the module; a group counts
  its largest N; a bare ``slow`` counts ``SLOW_DEFAULT_SECONDS``), so the soak, the install
  tier and the CUDA compile run beside the many short tests instead of after them. The order is the same in
  every worker (xdist requires identical collections) and only applies under xdist.
- Seconds per folder close the run (setup, call and teardown of its tests, summed: under xdist more than the
  wall time), to see which tier costs what.
- Summary lines. ``add_summary(config, section, line)`` leaves a line for the end of the run; under xdist the
  workers send theirs to the controller, which prints them (a worker's terminal is not shown).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ONE_WORKER_FOLDERS = ("tests/install", "tests/frameworks")
SLOW_DEFAULT_SECONDS = 30.0
_SUMMARY_KEY = "kestrel_summary"


def group_of(nodeid: str) -> str:
    """The group of a test id, as the workers send it to the controller: the name of its own
    ``xdist_group`` (xdist appends ``@name`` to the id under --dist loadgroup), else its folder's
    (``ONE_WORKER_FOLDERS``), else its module's."""
    if nodeid.rfind("@") > nodeid.rfind("]"):  # as xdist's LoadGroupScheduling (a parameter may hold an @)
        return nodeid.split("@")[-1]
    module = nodeid.split("::", 1)[0]
    for folder in ONE_WORKER_FOLDERS:
        if module.startswith(folder + "/"):
            return folder
    return module


def _item_group(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    return group_of(item.nodeid)


def cost_of(item: pytest.Item) -> float:
    """The seconds a ``slow`` mark announces (0 for a test not marked slow)."""
    mark = item.get_closest_marker("slow")
    if mark is None:
        return 0.0
    return float(mark.kwargs.get("seconds", SLOW_DEFAULT_SECONDS))


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "xdist_group(name): run with the other tests of this group on one xdist "
                                       "worker (tests/support/xdist_plan.py; default: the test's module)")


def pytest_collection_modifyitems(config, items) -> None:
    """Under xdist (on each worker, which all collect the same): the costliest groups first, then the others in
    collection order; a group's tests stay together, in their order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    groups = {item.nodeid: _item_group(item) for item in items}
    cost: dict[str, float] = {}
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        g = groups[item.nodeid]
        cost[g] = max(cost.get(g, 0.0), cost_of(item))  # a module-wide mark is the module's, not each test's
        first_seen.setdefault(g, i)
    items.sort(key=lambda it: (-cost[groups[it.nodeid]], first_seen[groups[it.nodeid]]))


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # an xdist hook, on the controller; before xdist's own
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadGroupScheduling

    class GroupScheduling(LoadGroupScheduling):
        """--dist loadgroup with a module's tests (or a folder's) as one unit when they name no group, and the
        workers' order kept (the costliest first, pytest_collection_modifyitems above)."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

        def schedule(self) -> None:
            self.config.option.loadscopereorder = False
            super().schedule()

    return GroupScheduling(config, log)


# ---- lines for the end of the run -------------------------------------------------------------------------

def add_summary(config, section: str, line: str) -> None:
    """A line printed under ``section`` at the end of the run (also under xdist, by the controller)."""
    if not hasattr(config, "_kestrel_summary"):
        config._kestrel_summary = []
    config._kestrel_summary.append((section, line))


def pytest_sessionfinish(session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)  # set on an xdist worker only
    if workeroutput is not None:
        workeroutput[_SUMMARY_KEY] = [list(x) for x in getattr(session.config, "_kestrel_summary", [])]


@pytest.hookimpl(optionalhook=True)  # an xdist hook, on the controller: a worker has finished
def pytest_testnodedown(node, error) -> None:
    for section, line in getattr(node, "workeroutput", {}).get(_SUMMARY_KEY, []):
        add_summary(node.config, section, line)


_FOLDER_SECONDS: dict[str, list[float]] = {}  # folder -> [seconds, tests], from the reports this process sees


def pytest_runtest_logreport(report) -> None:
    folder = "/".join(report.nodeid.split("::", 1)[0].split("/")[:2])
    entry = _FOLDER_SECONDS.setdefault(folder, [0.0, 0])
    entry[0] += report.duration
    entry[1] += report.when == "call" or (report.when == "setup" and report.skipped)


def pytest_terminal_summary(terminalreporter) -> None:
    if _FOLDER_SECONDS and not hasattr(terminalreporter.config, "workeroutput"):
        terminalreporter.section("seconds per folder (setup + call + teardown of its tests, summed over workers)")
        for folder, (seconds, tests) in sorted(_FOLDER_SECONDS.items(), key=lambda kv: -kv[1][0]):
            terminalreporter.write_line(f"{seconds:8.1f} s  {tests:5d} tests  {folder}")
    lines = getattr(terminalreporter.config, "_kestrel_summary", [])
    for section in dict.fromkeys(s for s, _ in lines):
        terminalreporter.section(section)
        for s, line in lines:
            if s == section:
                terminalreporter.write_line(line)
