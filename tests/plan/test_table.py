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
