"""The hub streams' floor keys (hubStreamMinMBps, hubStreamFloorShare, hubStreamWindowSeconds): their defaults are
the weights program's own, they reach its command line in the weights step, and a bad value is refused naming the
key."""

from __future__ import annotations

import pytest

from kimi_cluster.blueprint import render_step
from kimi_cluster.node import fetch_weights
from kimi_cluster.settings import SettingsError
from kimi_cluster.settings.loader import load_settings
from tests.node.conftest import BASE

REQUIRED = ["--repo", "r/m", "--revision", "0" * 40, "--cache-dir", "c", "--record", "r", "--progress-file", "p"]


def load(**raw):
    return load_settings({**BASE, **raw}, "dev")


def flags(step: str) -> dict[str, str]:
    words = step.replace("\\\n", " ").split()
    return {w: words[i + 1] for i, w in enumerate(words) if w in ("--hub-min-rate", "--hub-floor-share",
                                                                  "--hub-window")}


def test_unset_the_step_passes_the_programs_own_defaults():
    own = fetch_weights.parse_args(REQUIRED)
    assert flags(render_step(load(), "weights", 0, "10.0.0.5", "10.0.0.5")) == {
        "--hub-min-rate": f"{own.hub_min_rate:.0f}", "--hub-floor-share": f"{own.hub_floor_share:g}",
        "--hub-window": f"{own.hub_window:g}"}


def test_set_they_reach_the_weights_program():
    s = load(hubStreamMinMBps="25", hubStreamFloorShare="0.4", hubStreamWindowSeconds="30")
    got = flags(render_step(s, "weights", 0, "10.0.0.5", "10.0.0.5"))
    assert got == {"--hub-min-rate": "25000000", "--hub-floor-share": "0.4", "--hub-window": "30"}
    parsed = fetch_weights.parse_args(REQUIRED + [x for kv in got.items() for x in kv])
    assert (parsed.hub_min_rate, parsed.hub_floor_share, parsed.hub_window) == (25e6, 0.4, 30.0)


@pytest.mark.parametrize(("key", "value"), [
    ("hubStreamMinMBps", "0"), ("hubStreamMinMBps", "nan"), ("hubStreamFloorShare", "1"),
    ("hubStreamFloorShare", "-0.1"), ("hubStreamWindowSeconds", "0.5"), ("hubStreamWindowSeconds", "inf"),
])
def test_bad_values_are_refused_naming_the_key(key, value):
    with pytest.raises(SettingsError) as err:
        load(**{key: value})
    assert f"kimi-cluster:{key}" in str(err.value), str(err.value)
