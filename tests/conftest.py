"""Suite-wide hooks: the bring-up flows (marker `flow`) start first on every xdist worker, and their wall times
reach the terminal summary; no test may leave a server thread spinning on a closed socket (tests/leaks.py).

pytest.ini runs the suite under pytest-xdist with `--dist worksteal`, which hands worker i the i-th of N equal
contiguous slices of the collection and lets an idle worker steal queued tests from the tail of a busy one's slice.
The flows take 10-160 s each and nearly everything else under a second, so the order is built per slice: the flows
are dealt to the slices longest first, each to the slice with the least flow time so far, and each slice starts
with its flows; the quick tests fill the rest (and are the ones stolen at the end).
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

# Seconds each flow (by test function, all under tests/sandbox/) took in a whole-suite run on 6 workers (this
# 2-core machine, the real Pulumi CLI, 2026-12-02); only their order matters. A flow not listed: DEFAULT_FLOW_SECONDS.
FLOW_SECONDS = {
    # The first run also makes the previous release's worktree and virtualenv (about 190 s), kept in ~/.cache.
    "test_a_stack_of_the_previous_release_upgrades_with_nothing_replaced": 99,
    "test_h100_rule_drift_found_by_refresh_and_up_and_a_destroy_with_no_call_per_rule": 146,
    "test_two_replicas_behind_a_front_upgrade_with_no_failed_request": 111,
    "test_b300_a_vm_deleted_behind_the_stacks_back_comes_back_with_its_chain": 89,
    "test_b300_a_vm_stopped_or_resized_behind_the_stacks_back_is_reported_and_replaced": 81,
    "test_destroy_then_up_restores_the_kernels_and_a_corrupt_archive_starts_cold": 236,
    "test_a_lost_replica_comes_back_from_its_twin_with_no_hub_bytes": 171,
    "test_a_rolling_image_change_restarts_one_replica_at_a_time_with_no_failed_request": 159,
    "test_tokenspeeds_kernel_folders_travel_across_destroy_and_up": 158,
    "test_h100_flow_firewall_checkpoint_and_a_dead_engine": 154,
    "test_an_interrupted_up_resumes_with_no_second_vm_and_destroys_clean": 129,
    "test_a_rotated_ssh_key_reruns_every_step_on_every_node_at_no_cost": 112,
    "test_an_unreachable_store_starts_cold_and_the_endpoint_still_comes_up": 109,
    "test_a_reclaimed_replica_costs_no_non_streamed_request": 94,
    "test_placed_in_the_second_region_through_a_429_storm_and_kept_there": 92,
    "test_tokenspeed_flow_needs_the_users_image_then_serves_behind_its_gateways_shape": 91,
    "test_b300_flow_with_its_own_services_and_reruns": 83,
    "test_vllm_head_behind_the_proxy_key_rotation_and_cidrs": 78,
    "test_status_mid_up_after_up_and_when_stuck": 69,
    "test_a_hung_step_fails_up_through_its_own_node_side_deadline": 42,
    "test_destroy_after_a_killed_up_leaves_nothing": 33,
    "test_vm_in_error_fails_up_with_the_reason_and_leaves_no_vm": 32,
}
DEFAULT_FLOW_SECONDS = 60
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


def _seconds(item: Marked) -> float:
    return FLOW_SECONDS.get(item.name.split("[", 1)[0], DEFAULT_FLOW_SECONDS)


def _slices(count: int, workers: int) -> list[int]:
    """The sizes of worksteal's first slices: each idle worker gets len(pending) // workers-left, in turn."""
    sizes = []
    for i in range(workers):
        sizes.append(count // (workers - i))
        count -= sizes[-1]
    return sizes


def order(items: list[ItemT], workers: int) -> list[ItemT]:
    flows = sorted((i for i in items if i.get_closest_marker("flow")), key=_seconds, reverse=True)
    quick = [i for i in items if not i.get_closest_marker("flow")]
    if workers <= 1:
        return flows + quick
    sizes = _slices(len(items), workers)
    dealt: list[list[ItemT]] = [[] for _ in sizes]
    load = [0.0] * workers
    for flow in flows:
        open_slices = [s for s in range(workers) if len(dealt[s]) < sizes[s]]
        target = min(open_slices, key=lambda s: (load[s], s))
        dealt[target].append(flow)
        load[target] += _seconds(flow)
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
