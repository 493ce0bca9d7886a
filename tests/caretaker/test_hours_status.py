"""`status`'s working-hours lines: the open window and the next, the last scheduled up from the scheduler's record
on this host, and the last stop at a window's end from the caretaker's state, each with how long it took."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from kimi_cluster.operator.caretaker_status import caretaker_view, format_caretaker
from kimi_cluster.operator.hours_status import format_hours_status, hours_view
from kimi_cluster.operator.scheduler import STATE_FILE, default_state_dir
from tests.caretaker.test_caretaker_status import Runner, _settings, _state

SCHEDULE = json.dumps({"timeZone": "Europe/Berlin", "windows": [
    {"days": ["mon", "tue", "wed", "thu", "fri"], "start": "08:00", "end": "19:00"}]})


def test_status_names_the_window_the_last_scheduled_up_and_the_last_stop(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    folder = default_state_dir("dev")
    folder.mkdir(parents=True)
    (folder / STATE_FILE).write_text(json.dumps({"current": None, "ups": [
        {"opening": "2026-12-07T07:00:00Z", "window": "mon 08:00-19:00 CET (1 replica)", "outcome": "ok",
         "verified": True, "attempts": 1, "started": "2026-12-07T06:10:00Z", "ended": "2026-12-07T06:38:30Z"}]}))
    caretaker_state = {"served_since": 1.0, "action": None, "history": [
        {"reason": "hours", "why": "the working window closed at Mon 19:00 CET (kimi-cluster:schedule)",
         "started_at": "2026-12-07T18:00:20Z", "done_at": "2026-12-07T18:00:31Z", "deleted": ["kimi-dev-node0"]},
        {"reason": "idle", "why": "no request", "started_at": "2026-12-08T10:00:00Z",
         "done_at": "2026-12-08T10:00:05Z", "deleted": ["kimi-dev-node0"]}]}
    view = caretaker_view(_state(), _settings(schedule=SCHEDULE), Runner(0, json.dumps(caretaker_state)))
    assert view is not None
    text = "\n".join(format_caretaker(view))
    assert "working hours: " in text and "next " in text
    assert ("last scheduled up 2026-12-07T06:10:00Z in 28.5 min for mon 08:00-19:00 CET (1 replica): ok, verified "
            "(1 attempt(s))") in text
    assert "last stop at a window's end 2026-12-07T18:00:20Z, took 11 s: deleted kimi-dev-node0" in text


def test_the_window_open_and_closed():
    schedule = {"time_zone": "Europe/Berlin", "windows": [{"days": [0], "start": "08:00", "end": "19:00",
                                                           "replicas": 1}]}
    monday_noon = datetime(2026, 12, 7, 11, 0, tzinfo=UTC)
    lines = format_hours_status(hours_view(schedule, monday_noon, None, None))
    assert lines[0] == ("working hours: open: mon 08:00-19:00 CET (1 replica) until Mon 19:00 CET; next mon "
                        "08:00-19:00 CET (1 replica) from Mon 2026-12-14 08:00 CET")
    assert "no record on this host" in lines[1]
    closed = format_hours_status(hours_view(schedule, datetime(2026, 12, 7, 19, 0, tzinfo=UTC), None,
                                            {"running": True, "started": "2026-12-14T06:00:00Z",
                                             "window": "mon 08:00-19:00 CET (1 replica)"}))
    assert closed[0].startswith("working hours: closed; next mon 08:00-19:00 CET")
    assert "scheduled up running since 2026-12-14T06:00:00Z" in closed[1]
    assert format_hours_status(hours_view(None, monday_noon, None, None)) == []
