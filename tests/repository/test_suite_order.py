"""The suite's order under xdist worksteal (tests/conftest.py): every worker's first slice starts with its share
of the bring-up flows, dealt in turn; the quick tests fill the slices."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from tests.conftest import (
    WORKERS_PER_CORE,
    _slices,
    order,
    pytest_configure_node,
    pytest_xdist_auto_num_workers,
    slice_count,
)


@dataclass
class FakeItem:
    name: str
    flow: bool
    long: bool = False

    def get_closest_marker(self, marker: str) -> object:
        return (marker == "flow" and self.flow) or (marker == "long" and self.long) or None


def test_worksteal_slices_are_the_schedulers() -> None:
    assert _slices(10, 4) == [2, 2, 3, 3] and sum(_slices(939, 4)) == 939


def test_each_slice_starts_with_its_share_of_the_flows() -> None:
    flows = [FakeItem(f"test_flow_{i}", True) for i in range(17)]
    quick = [FakeItem(f"test_quick_{i}", False) for i in range(40)]
    items = quick[:20] + flows + quick[20:]
    ordered = order(items, 4)
    assert sorted(i.name for i in ordered) == sorted(i.name for i in items)  # nothing lost or doubled
    start = 0
    counts = []
    for size in _slices(len(items), 4):
        part = ordered[start:start + size]
        start += size
        flags = [bool(i.get_closest_marker("flow")) for i in part]
        counts.append(sum(flags))
        assert flags == [True] * counts[-1] + [False] * (size - counts[-1])  # the slice starts with its flows
    assert sum(counts) == len(flows) and max(counts) - min(counts) <= 1  # dealt in turn, no durations
    # One process: every flow first, in collection order.
    assert [i.name for i in order(items, 1)[:len(flows)]] == [f.name for f in flows]


def test_auto_asks_for_three_workers_a_core() -> None:
    assert pytest_xdist_auto_num_workers(None) == WORKERS_PER_CORE * len(os.sched_getaffinity(0))


@dataclass
class FakeConfig:
    dist: str
    workerinput: dict[str, Any] = field(default_factory=dict)

    def getoption(self, name: str) -> str:
        assert name == "dist"
        return self.dist


def test_a_worker_orders_for_the_controllers_worksteal_though_its_own_dist_option_says_no() -> None:
    # xdist sets a worker's `dist` to "no"; the controller's hook hands its value over in workerinput.
    node = SimpleNamespace(config=FakeConfig("worksteal"), workerinput={"workerid": "gw0", "workercount": 6})
    pytest_configure_node(node)
    worker = FakeConfig("no", node.workerinput)
    assert slice_count(worker) == 6
    other = SimpleNamespace(config=FakeConfig("load"), workerinput={"workerid": "gw0", "workercount": 6})
    pytest_configure_node(other)
    assert slice_count(FakeConfig("no", other.workerinput)) == 1
    assert slice_count(FakeConfig("worksteal")) == 1


def test_the_tests_of_minutes_lead_one_a_slice_before_the_flows() -> None:
    # A long flow (the working hours) and long tests that are no flow (the every-cut tests), late in collection.
    flows = [FakeItem(f"test_flow_{i}", True) for i in range(10)]
    quick = [FakeItem(f"test_quick_{i}", False) for i in range(30)]
    long = [FakeItem("test_hours", True, long=True), FakeItem("test_cuts", False, long=True)]
    ordered = order(quick + flows + long, 4)
    sizes = _slices(len(ordered), 4)
    firsts = [ordered[sum(sizes[:s])].name for s in range(4)]
    assert firsts[:2] == ["test_hours", "test_cuts"], firsts  # each starts its own worker, at once
    assert [i.name for i in order(quick + flows + long, 1)[:2]] == ["test_hours", "test_cuts"]
