"""The step table itself: every entry complete and the one home of its step's name, and the plan's admission reading
it (stepDeadlineMinutes' names and floors, nodeTiming's week)."""

from __future__ import annotations

import json

import pytest

from kimi_cluster.blueprint.admission import admit
from kimi_cluster.plan.jinja import TEMPLATES_DIR as TEMPLATES
from kimi_cluster.plan.steps.model import ENDPOINT, FRONT, HEAD, NODE
from kimi_cluster.plan.steps.table import NAMES, TABLE
from kimi_cluster.settings import SettingsError
from tests.node.conftest import make_settings


def test_every_entry_names_a_template_a_summary_and_a_place():
    assert len(set(NAMES)) == len(NAMES) == len(TABLE)
    for step in TABLE:
        assert (TEMPLATES / step.template_name).is_file(), step.name
        assert step.summary and "\n" not in step.summary, step.name
        assert step.where in (NODE, HEAD, FRONT, ENDPOINT), step.name
        for token in step.after:
            name = token.partition("@")[0]
            assert not name or name in NAMES, (step.name, token)


def test_admission_refuses_a_deadline_for_no_step_naming_the_tables_steps():
    with pytest.raises(SettingsError) as refused:
        admit(make_settings(stepDeadlineMinutes='{"imgae": 10}'))
    assert f"'imgae' is not a node step; steps are {', '.join(NAMES)}" in str(refused.value)


def test_admission_refuses_node_timing_that_makes_a_default_deadline_past_a_week():
    timing = json.dumps({"pullAttempts": 100, "pullTimeoutS": 86400})
    with pytest.raises(SettingsError, match="nodeTiming makes the image step's deadline .* past the week"):
        admit(make_settings(nodeTiming=timing))
    admit(make_settings(nodeTiming=timing, stepDeadlineMinutes={"image": 600}))  # its own deadline bounds it


@pytest.mark.parametrize("stack, timing", [("dev", {}), ("sandbox", {}), ("dev", {"peerTimeoutS": 7200}),
                                           ("dev", {"peerTimeoutS": 60, "deadlineSlackS": 30})])
def test_the_weights_step_outlasts_its_download_and_the_peer_timeout_on_every_shared_stack(stack, timing):
    """The step follows its download for the download's time plus the peer timeout (a node may wait that long for
    a peer's first answer before it takes that share from the hub), and its deadline leaves slack past both: the
    sandbox's 5-minute download with the 300 s peer timeout once ran out of the follow loop's own 300 s."""
    import re

    from kimi_cluster.blueprint import render_step
    from kimi_cluster.blueprint.inputs import resolved_timing
    from kimi_cluster.plan.steps.clocks import deadline_s
    from kimi_cluster.plan.weights_download import wait_timeout_s

    extra = {"nodeTiming": json.dumps(timing)} if timing else {}
    if stack == "sandbox":
        from kimi_cluster.sandbox.nodes import stack_settings
        settings = stack_settings("h100x4-sglang", extra)
    else:
        settings = make_settings("h100x4-sglang", **extra)
    t = resolved_timing(settings, None)
    script = render_step(settings, "weights", 1, "10.0.0.6", "10.0.0.5", peer_ips=[f"10.0.0.{5 + r}" for r in range(4)])
    waited = int(re.search(r"deadline=\$\(\( SECONDS \+ (\d+) \)\)", script).group(1))
    assert waited == wait_timeout_s(t, True) == t.download_s + t.peer_timeout_s
    assert deadline_s("weights", t) >= waited + 5 * t.deadline_slack_s
