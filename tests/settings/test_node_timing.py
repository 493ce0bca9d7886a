"""kimi-cluster:nodeTiming: camelCase Timing fields over Timing()'s defaults, each checked, reaching every step."""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

import pytest

from kimi_cluster.blueprint import render_step
from kimi_cluster.blueprint.inputs import resolved_timing
from kimi_cluster.plan.steps.clocks import deadline_s
from kimi_cluster.settings import SettingsError
from kimi_cluster.settings.loader import load_settings, read_stack_file
from kimi_cluster.settings.node_timing import FIELDS
from kimi_cluster.settings.timing import Timing
from tests.node.conftest import BASE

ROOT = Path(__file__).resolve().parents[2]


def load(**raw):
    return load_settings({**BASE, **raw}, "dev")


def test_unset_or_empty_is_todays_timing_exactly():
    assert load().timing == Timing()
    assert load(nodeTiming="{}").timing == Timing()
    assert load(nodeTiming={}).timing == Timing()


def test_every_field_but_those_other_keys_set_has_a_camel_case_key():
    # The two long deadlines, the steps' deadlines and the kernel-cache transfers have keys of their own (the
    # blueprint fills them in: kimi_cluster/blueprint/inputs.py resolved_timing).
    own = {"download_timeout_s", "readiness_timeout_s", "step_deadline_minutes", "cache_restore_minutes",
           "cache_save_minutes"}
    assert set(FIELDS.values()) == {f.name for f in fields(Timing)} - own
    with pytest.raises(Exception, match="stepDeadlineMinutes is set by kimi-cluster:stepDeadlineMinutes"):
        load(nodeTiming=json.dumps({"stepDeadlineMinutes": 5}))
    assert FIELDS["settleSeconds"] == "settle_seconds" and FIELDS["proxySettleSeconds"] == "proxy_settle_seconds"


def test_given_fields_override_the_defaults_and_keep_their_types():
    timing = load(nodeTiming=json.dumps({"settleSeconds": 1, "pollSeconds": 5, "fastPollSeconds": 0.5})).timing
    assert timing == Timing(settle_seconds=1, poll_seconds=5, fast_poll_seconds=0.5)
    assert type(timing.poll_seconds) is int and type(timing.fast_poll_seconds) is float
    # As `pulumi config set --path` may store them: numbers as text.
    assert load(nodeTiming={"settleSeconds": "1.5", "logTail": "20"}).timing == Timing(settle_seconds=1.5, log_tail=20)


def test_an_unknown_key_names_the_setting_the_key_and_the_close_match():
    with pytest.raises(SettingsError) as err:
        load(nodeTiming='{"settleSecond": 1}')
    text = str(err.value)
    assert "kimi-cluster:nodeTiming" in text and "'settleSecond'" in text and "did you mean settleSeconds?" in text


@pytest.mark.parametrize(("value", "reason"), [
    ({"pollSeconds": 1.5}, "pollSeconds: 1.5 is not a positive whole number"),
    ({"pullAttempts": True}, "pullAttempts: True is not a positive whole number"),
    ({"settleSeconds": 0}, "settleSeconds: 0 is not a positive number"),
    ({"settleSeconds": -1}, "settleSeconds: -1 is not a positive number"),
    ({"settleSeconds": math.inf}, "settleSeconds: inf is not a positive number"),
    ({"settleSeconds": "NaN"}, "settleSeconds: 'NaN' is not a positive number"),
    ({"settleSeconds": None}, "settleSeconds: None is not a positive number"),
    ({"launchTimeoutS": 86401}, "launchTimeoutS: 86401 is more than 86,400"),
    ({"pullAttempts": 101}, "pullAttempts: 101 is more than 100"),
    ({"pollSeconds": 3601}, "pollSeconds: 3601 is more than 3,600"),
    ({"downloadTimeoutS": 60}, "downloadTimeoutS is set by kimi-cluster:downloadTimeoutMinutes"),
    ({"readinessTimeoutS": 60}, "readinessTimeoutS is set by kimi-cluster:readinessTimeoutMinutes"),
    ("[1, 2]", "expected a JSON object of timing -> number"),
    ("{not json", "expected a JSON object of timing -> number"),
])
def test_bad_values_are_refused_naming_the_key(value, reason):
    with pytest.raises(SettingsError) as err:
        load(nodeTiming=value if isinstance(value, str) else json.dumps(value))
    assert "kimi-cluster:nodeTiming: " in str(err.value) and reason in str(err.value), str(err.value)


def test_the_settings_timing_reaches_the_scripts_and_the_deadlines():
    fast = load(nodeTiming='{"settleSeconds": 1, "launchTimeoutS": 60}')
    assert "sleep 1\n" in render_step(fast, "launch", 0, "10.0.0.5", "10.0.0.5")
    assert "sleep 15\n" in render_step(load(), "launch", 0, "10.0.0.5", "10.0.0.5")
    assert deadline_s("launch", resolved_timing(fast)) == 61


def test_the_sandbox_stack_shortens_the_settle_checks_only():
    raw, _ = read_stack_file(str(ROOT / "Pulumi.sandbox.yaml"))
    timing = load(nodeTiming=raw["nodeTiming"]).timing
    assert timing == Timing(settle_seconds=2, proxy_settle_seconds=1)
