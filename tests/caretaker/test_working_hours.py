"""Working hours (kimi-cluster:schedule): the settings refuse a bad schedule naming the key, the window arithmetic
(kimi_cluster/node/working_hours.py) across a daylight saving change and midnight, and the caretaker with hours
(kimi_cluster/node/caretaker_hours.py) against the Hyperstack emulator: it stops at a window's end and not before,
leaves the 503 with the next window's start and a Retry-After, and leaves an idle stop its own.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from zoneinfo import ZoneInfo

import pytest

from kimi_cluster.node import caretaker, caretaker_hours, working_hours
from kimi_cluster.settings.errors import SettingsError
from kimi_cluster.settings.loader import load_settings
from tests.caretaker.test_caretaker_program import (  # the same emulator, cluster and config as the caretaker's own
    MINUTE_S,
    NAMES,
    _cluster,
    _config,
    _live,
    emu,
    health,
)

__all__ = ["emu", "health"]  # fixtures, used by name

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGtpbWktY2x1c3Rlci10ZXN0LWtleS1ub3QtcmVhbCEh t"
WEEKDAYS = ["mon", "tue", "wed", "thu", "fri"]


def _settings(schedule, **extra):
    return load_settings({"operatorCidr": "81.2.69.1/32", "sshPublicKey": KEY, "topology": "b300x1-vllm",
                          "caretakerApiKey": "hyperstack-caretaker-key", "schedule": schedule, **extra}, "dev")


def _refused(schedule, **extra) -> str:
    with pytest.raises(SettingsError) as err:
        _settings(schedule, **extra)
    return str(err.value)


def test_a_schedule_is_compiled_and_each_window_gets_the_stacks_replicas_by_default():
    s = _settings(json.dumps({"timeZone": "Europe/Berlin", "windows": [
        {"days": WEEKDAYS, "start": "08:00", "end": "19:00"},
        {"days": ["sat"], "start": "10:00", "end": "24:00", "replicas": 2}]}), replicas="3")
    assert s.guarded and s.schedule == {"time_zone": "Europe/Berlin", "windows": [
        {"days": [0, 1, 2, 3, 4], "start": "08:00", "end": "19:00", "replicas": None},
        {"days": [5], "start": "10:00", "end": "24:00", "replicas": 2}]}
    from kimi_cluster.blueprint.caretaker import schedule_of
    compiled = schedule_of(s)
    assert compiled is not None and [w["replicas"] for w in compiled["windows"]] == [3, 2]


@pytest.mark.parametrize(("schedule", "extra", "named"), [
    ({"timeZone": "Europe/Berlinn", "windows": [{"days": ["mon"], "start": "08:00", "end": "19:00"}]}, {},
     "kimi-cluster:schedule: timeZone: 'Europe/Berlinn' is not a time zone"),
    ({"timeZone": "UTC", "windows": [{"days": WEEKDAYS, "start": "08:00", "end": "19:00"},
                                     {"days": ["sun", "wed"], "start": "18:30", "end": "20:00"}]}, {},
     "windows[1] overlaps windows[0] on wed"),
    ({"timeZone": "UTC", "windows": [{"days": ["mon"], "start": "8:00", "end": "19:00"}]}, {},
     "windows[0].start: '8:00' is not a time of day as HH:MM"),
    ({"timeZone": "UTC", "windows": [{"days": ["mon"], "start": "19:00", "end": "08:00"}]}, {},
     "windows[0]: end 08:00 is not after start 19:00"),
    ({"timeZone": "UTC", "windows": [{"days": ["Monday"], "start": "08:00", "end": "19:00"}]}, {},
     "windows[0].days[0]: Input should be 'mon'"),
    ({"timeZone": "UTC", "windows": []}, {}, "windows: List should have at least 1 item"),
    ({"timeZone": "UTC", "windows": [{"days": ["mon"], "start": "08:00", "end": "19:00", "replicas": 3}]},
     {"replicas": "2"}, "kimi-cluster:schedule.windows[0].replicas 3 is more than the stack is sized for "
                        "(kimi-cluster:replicas 2)"),
    ({"timeZone": "UTC", "windows": [{"days": ["mon"], "start": "08:00", "end": "19:00", "replicas": 1}]},
     {"replicas": "2"}, "kimi-cluster:schedule.windows[0].replicas 1: a stack of 2 replicas serves through its front"),
    ({"timeZone": "UTC", "windows": [{"days": ["mon"], "start": "08:00", "end": "19:00"}], "zone": "x"}, {},
     "zone: Extra inputs are not permitted"),
    ("[1, 2]", {}, "is not a JSON object"),
])
def test_a_bad_schedule_is_refused_naming_its_key(schedule, extra, named):
    text = _refused(schedule if isinstance(schedule, str) else json.dumps(schedule), **extra)
    assert named in text, text


def test_the_stop_needs_the_caretakers_key():
    text = str(pytest.raises(SettingsError, load_settings, {
        "operatorCidr": "81.2.69.1/32", "sshPublicKey": KEY, "topology": "b300x1-vllm",
        "schedule": {"timeZone": "UTC", "windows": [{"days": ["mon"], "start": "08:00", "end": "19:00"}]}},
        "dev").value)
    assert "kimi-cluster:caretakerApiKey is required with kimi-cluster:schedule" in text


BERLIN = {"time_zone": "Europe/Berlin", "windows": [{"days": [0, 1, 2, 3, 4], "start": "08:00", "end": "19:00",
                                                     "replicas": 1}]}


def test_windows_follow_the_zones_clock_across_daylight_saving():
    # Friday 2026-03-27 19:30 Berlin (CET, UTC+1): closed; the next window opens Monday 08:00 CEST (UTC+2).
    friday = datetime(2026, 3, 27, 18, 30, tzinfo=UTC)
    assert working_hours.open_now(BERLIN, friday) is None
    following = working_hours.next_opening(BERLIN, friday)
    assert following is not None and following.start.astimezone(UTC) == datetime(2026, 3, 30, 6, 0, tzinfo=UTC)
    assert working_hours.last_close(BERLIN, friday).astimezone(UTC) == datetime(2026, 3, 27, 18, 0, tzinfo=UTC)
    opened = working_hours.open_now(BERLIN, datetime(2026, 3, 30, 6, 0, tzinfo=UTC))
    assert opened is not None and opened.describe() == "mon 08:00-19:00 CEST (1 replica)"
    assert working_hours.weekly_hours(BERLIN) == [(55.0, 1)]
    assert working_hours.http_date(following.start) == "Mon, 30 Mar 2026 06:00:00 GMT"


def test_windows_that_meet_at_midnight_leave_no_gap():
    night = {"time_zone": "UTC", "windows": [{"days": [0], "start": "20:00", "end": "24:00", "replicas": 1},
                                             {"days": [1], "start": "00:00", "end": "06:00", "replicas": 1}]}
    midnight = datetime(2026, 3, 31, 0, 0, tzinfo=UTC)  # a Tuesday
    assert working_hours.open_now(night, midnight) is not None
    assert working_hours.open_now(night, midnight - timedelta(seconds=1)) is not None


def _window_around(now: datetime, start_ago: timedelta, end_in: timedelta) -> dict:
    """A UTC window on today's weekday from `start_ago` before now to `end_in` after (whole minutes)."""
    start, end = now - start_ago, now + end_in
    assert start.date() == end.date() == now.date(), "the test needs a window within today (UTC)"
    return {"time_zone": "UTC", "windows": [{"days": [now.weekday()], "start": f"{start:%H:%M}",
                                             "end": f"{end:%H:%M}", "replicas": 2}]}


def _poll(config) -> dict:
    assert caretaker_hours.main(["--config", str(config), "--once"]) == 0
    return json.loads((config.parent / "state.json").read_text())


def test_inside_a_window_and_ahead_of_one_it_stops_nothing(tmp_path, emu, health):
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    if now.hour in (0, 23):
        pytest.skip("the window must fit in today (UTC)")
    _cluster(emu, NAMES)
    open_window = _config(tmp_path, emu, health.url, schedule=_window_around(now, timedelta(minutes=30),
                                                                             timedelta(minutes=30)))
    caretaker.arm(json.loads(open_window.read_text()))
    assert _poll(open_window)["action"] is None
    # Armed ahead of a window (the scheduler's up): the window that closed before the arming is no reason to stop.
    ahead = _config(tmp_path, emu, health.url, schedule={"time_zone": "UTC", "windows": [
        {"days": [(now - timedelta(days=1)).weekday()], "start": "00:00", "end": "00:01", "replicas": 2},
        *_window_around(now, -timedelta(minutes=40), timedelta(minutes=50))["windows"]]})
    assert _poll(ahead)["action"] is None and _live(emu) == sorted(NAMES + ["kimi-dev-front", "kimi-other-node0"])


def test_at_a_windows_end_it_stops_with_its_own_reason_and_names_the_next(tmp_path, emu, health):
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    if now.hour in (0, 23):
        pytest.skip("the window must fit in today (UTC)")
    _cluster(emu, NAMES)
    schedule = _window_around(now, timedelta(minutes=50), -timedelta(minutes=20))  # closed 20 minutes ago
    config = _config(tmp_path, emu, health.url, schedule=schedule, idle_seconds=15 * MINUTE_S * 1000)
    cfg = json.loads(config.read_text())
    caretaker.arm(cfg)
    state = json.loads((tmp_path / "state.json").read_text())
    state["armed_at"] = (now - timedelta(minutes=45)).timestamp()  # armed inside the window
    (tmp_path / "state.json").write_text(json.dumps(state))
    state = _poll(config)
    action = state["action"]
    assert action["reason"] == "hours" and action["done_at"] and action["deleted"] == NAMES[::-1]
    assert _live(emu) == ["kimi-dev-front", "kimi-other-node0"]
    flags = tmp_path / "flags"
    body = json.loads((flags / caretaker.STOPPED_FILE).read_text())["error"]
    next_start = datetime.combine(now.date() + timedelta(days=7), datetime.strptime(
        schedule["windows"][0]["start"], "%H:%M").time(), ZoneInfo("UTC"))
    assert body["code"] == 503 and body["reason"] == "hours"
    assert body["next_window"] == f"{next_start:%Y-%m-%dT%H:%M:%SZ}"
    retry_after = (flags / caretaker_hours.RETRY_AFTER_FILE).read_text()
    assert "\n" not in retry_after and parsedate_to_datetime(retry_after) == next_start
    # The next up (the scheduler's, ahead of that window) re-creates the VMs: the 503 and its Retry-After go.
    from tests.caretaker.test_caretaker_program import _cluster_vms
    _cluster_vms(emu, NAMES)
    state = _poll(config)
    assert state["action"] is None and not (flags / caretaker.STOPPED_FILE).exists()
    assert not (flags / caretaker_hours.RETRY_AFTER_FILE).exists()
    caretaker.arm(cfg)  # its caretaker step: armed after the close, so nothing is stopped until the next window ends
    assert _poll(config)["action"] is None


def test_an_idle_stop_inside_a_window_stays_an_idle_stop_without_retry_after(tmp_path, emu, health):
    import time

    now = datetime.now(UTC).replace(second=0, microsecond=0)
    if now.hour in (0, 23):
        pytest.skip("the window must fit in today (UTC)")
    _cluster(emu, NAMES)
    config = _config(tmp_path, emu, health.url, idle_seconds=15 * MINUTE_S,
                     schedule=_window_around(now, timedelta(minutes=30), timedelta(minutes=30)))
    caretaker.arm(json.loads(config.read_text()))
    assert _poll(config)["action"] is None
    time.sleep(15 * MINUTE_S + 0.2)
    action = _poll(config)["action"]
    assert action["reason"] == "idle" and action["done_at"]
    assert not (tmp_path / "flags" / caretaker_hours.RETRY_AFTER_FILE).exists()


def test_the_sandboxs_clock_runs_the_schedule_on_its_short_minutes():
    epoch = datetime(2026, 3, 30, 0, 0, tzinfo=UTC)  # a Monday
    fast = {"time_zone": "UTC", "clock": {"epoch": epoch.timestamp(), "scale": 60.0},
            "windows": [{"days": [0], "start": "10:00", "end": "11:00", "replicas": 1}]}
    following = working_hours.next_opening(fast, epoch)
    assert following is not None and following.start == epoch + timedelta(seconds=600)  # 10 hours of 1-s minutes
    assert following.end == epoch + timedelta(seconds=660)
    assert working_hours.open_now(fast, epoch + timedelta(seconds=630)) is not None
    assert working_hours.last_close(fast, epoch + timedelta(seconds=661)) == following.end
    # Only with the sandbox's test clock: a real stack keeps the wall clock.
    window = {"timeZone": "UTC", "testClockEpoch": epoch.timestamp(),
              "windows": [{"days": ["mon"], "start": "10:00", "end": "11:00"}]}
    assert "kimi-cluster:schedule.testClockEpoch runs the schedule on the sandbox's shortened minutes" in _refused(
        json.dumps(window))
    s = _settings(json.dumps(window), caretakerTiming='{"pollSeconds": 1, "minuteSeconds": 1}',
                  caretakerApiUrl="http://127.0.0.1:8700/v1")
    from kimi_cluster.blueprint.caretaker import schedule_of
    compiled = schedule_of(s)
    assert compiled is not None and compiled["clock"] == {"epoch": epoch.timestamp(), "scale": 60.0}
