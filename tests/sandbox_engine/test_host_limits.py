"""What the real engine and host impose, and no more: 4 dynamic provider calls at once, no customTimeouts deadline.

The host's gRPC server has `ThreadPoolExecutor(max_workers=4)` (pulumi/dynamic/__main__.py): a 5th create waits for
one of the first 4 to finish, however many resources the engine starts at once. A program that counts on more
dynamic provider calls at once is as slow here as under the Pulumi CLI.
"""

from __future__ import annotations

import pytest

from sandbox.engine import run_up

from .conftest import calls

pytestmark = pytest.mark.timeout(120)


def test_six_slow_dynamic_creates_run_at_most_four_at_a_time(make_project, toy_dir, tmp_path) -> None:
    result = run_up(make_project("wide"), "dev", tmp_path / "work", {"toyDir": str(toy_dir)}, echo=False)
    assert len(result.outputs["paths"]) == 6
    events = sorted((c["t"], c["phase"]) for c in calls(toy_dir) if c["op"] == "create")
    running = peak = 0
    for _, phase in events:
        running += 1 if phase == "start" else -1
        peak = max(peak, running)
    assert peak == 4
    starts = sorted(t for t, phase in events if phase == "start")
    ends = sorted(t for t, phase in events if phase == "end")
    # The last two began only after the first of the first four had finished.
    assert starts[4] >= ends[0] and starts[5] >= ends[0]


def test_custom_timeouts_stop_neither_a_running_command_nor_a_provider_call(make_project, toy_dir, tmp_path) -> None:
    # pulumi-command applies customTimeouts to its SSH dial only, and the engine sets no deadline on a provider
    # call: both outlive a 1 s customTimeout, as under the Pulumi CLI. Only a step's own deadline stops it.
    result = run_up(make_project("patient"), "dev", tmp_path / "work", {"toyDir": str(toy_dir)}, echo=False)
    assert result.outputs["slow"] == "finished"
    assert result.outputs["late"].endswith("late")
