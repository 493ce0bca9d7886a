"""Suite-wide hooks: the bring-up flows (marker `flow`) start first on every xdist worker, and their wall times
reach the terminal summary; no test may leave a server thread spinning on a closed socket (tests/leaks.py).

pytest.ini runs the suite under pytest-xdist with `--dist worksteal`, which hands worker i the i-th of N equal
contiguous slices of the collection and lets an idle worker steal queued tests from the tail of a busy one's slice.
The flows take 10-160 s each and nearly everything else under a second, so the order is built per slice: the flows
are dealt to the slices in turn, the few tests of minutes by design (marker `long`) first, and each slice starts
with its flows; the quick tests fill the rest, and worksteal balances what is left (no test's duration is written
down here: the scheduler measures nothing, it just steals). The worker count follows the machine (`-n auto`,
pytest_xdist_auto_num_workers below).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator
from typing import Any, Protocol, TypeVar

import pytest

from tests import leaks, wall_times

# The fake-node fixtures (`node`, `node_factory`), for every folder that starts fake nodes.
pytest_plugins = ["tests.fakenode_fixtures"]

# Byte code is cached for this run and the processes it starts (workers, the sandbox's CLI, engine and provider hosts,
# the fake nodes' Python stubs), even on a machine that sets PYTHONDONTWRITEBYTECODE (this one and its CI do): else
# each of some 2,000 interpreters compiles the modules it imports again, and pytest rewrites and compiles every test
# module again in each worker. __pycache__/ is ignored by git.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# The workerinput key that carries the controller's --dist to the workers.
DIST_KEY = "kimi_dist"


class Marked(Protocol):
    """What the ordering reads of a test item (a pytest.Item, or a test's stand-in)."""

    name: str

    def get_closest_marker(self, name: str) -> Any: ...


class WorkerConfig(Protocol):
    """What slice_count reads of a pytest.Config (a worker's also has `workerinput`)."""

    def getoption(self, name: str) -> Any: ...


ItemT = TypeVar("ItemT", bound=Marked)


def _slices(count: int, workers: int) -> list[int]:
    """The sizes of worksteal's first slices: each idle worker gets len(pending) // workers-left, in turn."""
    sizes = []
    for i in range(workers):
        sizes.append(count // (workers - i))
        count -= sizes[-1]
    return sizes


def _first(item: Marked) -> bool:
    return bool(item.get_closest_marker("long") or item.get_closest_marker("flow"))


def order(items: list[ItemT], workers: int) -> list[ItemT]:
    # The tests of minutes by design (marker `long`: a flow that waits on a schedule's windows, a stream cut after
    # every one of its tokens) lead, so that none of them starts late and runs on alone; then the flows.
    flows = [i for i in items if i.get_closest_marker("long")] + [i for i in items if _first(i) and not
                                                                   i.get_closest_marker("long")]
    quick = [i for i in items if not _first(i)]
    if workers <= 1:
        return flows + quick
    sizes = _slices(len(items), workers)
    dealt: list[list[ItemT]] = [[] for _ in sizes]
    for flow in flows:
        open_slices = [s for s in range(workers) if len(dealt[s]) < sizes[s]]
        dealt[min(open_slices, key=lambda s: (len(dealt[s]), s))].append(flow)
    rest = iter(quick)
    ordered: list[ItemT] = []
    for s, size in enumerate(sizes):
        ordered += dealt[s]
        ordered += [next(rest) for _ in range(size - len(dealt[s]))]
    return ordered


@pytest.hookimpl(optionalhook=True)  # an xdist hook: without xdist nothing calls it
def pytest_configure_node(node) -> None:
    # Runs in the controller for each worker it starts. xdist sets a worker's own `dist` option to "no", so the
    # controller's choice travels in workerinput (before this was there, every worker ordered as one process: all
    # the flows at the head of the first slice, left to be stolen one by one).
    node.workerinput[DIST_KEY] = node.config.getoption("dist")


def slice_count(config: WorkerConfig) -> int:
    """How many worksteal slices to order for: the worker count in a worker of a `--dist worksteal` run, else 1."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput and workerinput.get(DIST_KEY) == "worksteal":
        return int(workerinput["workercount"])
    return 1


NOT_UNIT = ("flow", "integration", "runtime_venv")
# Workers per core for `-n auto`: the flows spend most of their time waiting on the fakes' and the CLI's sleeps, so
# more workers than cores pay (on 2 cores, 6 workers finished the suite sooner than 2 or 4 did, docs/development.md).
WORKERS_PER_CORE = 3


@pytest.hookimpl(optionalhook=True)  # an xdist hook: without xdist nothing calls it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return WORKERS_PER_CORE * len(os.sched_getaffinity(0))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `unit` is what is left: every test that starts no bring-up, fake node, server or outside tool.
    for item in items:
        if not any(item.get_closest_marker(name) for name in NOT_UNIT):
            item.add_marker(pytest.mark.unit)
    # Each xdist worker collects and orders; the order depends only on the items and the worker count, so every
    # worker builds the same list (xdist requires it). Without xdist: the flows first, longest first.
    items[:] = order(items, slice_count(config))


@pytest.fixture(autouse=True)
def _no_spinning_server_thread() -> Generator[None, None, None]:
    yield
    spinning = leaks.spinning_servers()
    # Fail the test that left it, not a later one that would only run slower.
    assert not spinning, f"a server thread outlived its server and spins on its closed socket: {spinning}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport,
                                                                                           pytest.TestReport]:
    report = yield
    # Each phase's report gets the lines reported during it (xdist sends user_properties to the controller).
    if wall_times.PENDING:
        report.user_properties.extend((wall_times.PROPERTY, line) for line in wall_times.PENDING)
        wall_times.PENDING.clear()
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Without xdist this runs in the one process; with it, in the controller (from the worker's report) and in
    # the worker (whose summary is never shown).
    wall_times.COLLECTED.extend(str(value) for name, value in report.user_properties if name == wall_times.PROPERTY)


def pytest_terminal_summary(terminalreporter) -> None:
    if wall_times.COLLECTED:
        terminalreporter.section("sandbox wall times")
        for line in wall_times.COLLECTED:
            terminalreporter.write_line(line)
