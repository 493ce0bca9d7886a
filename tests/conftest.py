"""Suite-wide hooks: the bring-up flows (marker `flow`) start first, and their wall times reach the summary.

pytest.ini runs the suite under pytest-xdist (`-n`, `--dist worksteal`). The flows take 30-130 s each and the rest
under a second, so the flows are put first, longest first (by file, from measured durations): the workers start
on them at once and an idle worker steals the quick tests at the end instead of waiting on one long flow.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from tests import wall_times

# Test files whose tests run a whole sandbox up, longest first (measured per test; unknown flow files go after).
SLOW_FIRST = (
    "tests/sandbox/test_kernel_cache_flow.py",
    "tests/sandbox/test_replicas_flow.py",
    "tests/sandbox/test_rerun.py",
    "tests/sandbox/test_flow.py",
    "tests/sandbox/test_interrupted.py",
    "tests/sandbox/test_status.py",
    "tests/sandbox/test_proxy.py",
    "tests/sandbox/test_faults.py",
    "tests/sandbox/test_regions.py",
)


def _rank(item: pytest.Item) -> tuple[int, int]:
    path = item.nodeid.split("::", 1)[0]
    if path in SLOW_FIRST:
        return (0, SLOW_FIRST.index(path))
    return (1, 0) if item.get_closest_marker("flow") else (2, 0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: the order within a rank stays the collection order


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
