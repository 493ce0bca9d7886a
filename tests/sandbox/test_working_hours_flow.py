"""Working hours in the sandbox, under the real Pulumi CLI and Pulumi's Automation API: 2 x b300x1-vllm behind a
front (the caretaker on the front, which stays and answers the 503), kimi-cluster:schedule on the sandbox's test
clock (schedule.testClockEpoch: one sandbox minute is one second, so an hour's window is a minute long).

The windows are placed from what the flow's own bring-up measured, not from a guess: the stack comes up with a
schedule whose windows are hours of the test clock away; then `pulumi config set` moves them as a user would (the
scheduler's first up applies it), the first one bring-up's wall time away and the second the scheduler's own lead
(--margin times the measured bring-up, from the stack's timeline) after the first one's stop.

- `kimi-cluster schedule` (the scheduler, a process of its own) starts an up ahead of the first window (the stack
  is up already: its up creates nothing) and its verify passes before the window opens; the endpoint answers at the
  window's start;
- at the window's end the caretaker deletes both replicas within a poll or two; the front answers 503 with the
  next window's start as Retry-After;
- the scheduler brings the replicas back ahead of the next window; killed in the middle of that up and started
  again, it finishes the bring-up with no VM twice and nothing left running; the endpoint answers at that window's
  start.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import pytest
import requests

from kimi_cluster.operator.scheduler import Record, Timing
from kimi_cluster.operator.scheduler import lead as scheduler_lead
from kimi_cluster.operator.timeline_report import bringup_seconds
from kimi_cluster.sandbox.pulumi_cli import PulumiCli, toolchain_bin

from .conftest import leftover_processes, ok, report, wait_for

pytestmark = [pytest.mark.flow, pytest.mark.long, pytest.mark.timeout(1800)]

GPU = ["kimi-sandbox-node0", "kimi-sandbox-r1-node0"]
FRONT = "kimi-sandbox-front"
POLL_S = 1
MARGIN = 2.0  # the lead is 3 bring-ups: the killed up's start, recovery (its pulumi ended, cancel, refresh), second
# up (every step of both replicas) and verify took 1.4 and 2.1 of the 42-s bring-up (load average 2, then 7)
WINDOW_S = 20  # the first window (20 test-clock minutes): the ask at its start has this long, its whole timeout
STOP_S = 20  # after its end, the caretaker's stop (a poll or two are its promise; 20 are allowed) before the lead
LAST_WINDOW_S = 300  # the second window, to the day's end, outlasts the flow (ask, status, destroy) by far at least


def _test_clock(now: float) -> tuple[float, datetime]:
    """An epoch that puts the schedule's clock at 01:00 of a day now (its minutes are seconds from the epoch on):
    the windows of that day are then ahead and within it."""
    soonest = datetime.fromtimestamp(now, UTC) + timedelta(hours=1)  # the epoch at least a minute back
    target = soonest.replace(hour=1, minute=0, second=0, microsecond=0)
    if target < soonest:
        target += timedelta(days=1)
    lag = (target.timestamp() - now) / 59  # schedule(now) = epoch + (now - epoch) * 60 = target
    return now - lag, target


def _real(epoch: float, scheduled: datetime) -> float:
    return epoch + (scheduled.timestamp() - epoch) / 60


def _gpu_vms(run) -> list[str]:
    return sorted(v["name"] for v in run.emulator().inventory()["virtual_machines"] if v["name"] in GPU)


def _env(run) -> dict[str, str]:
    """The sandbox's Pulumi home, backend and passphrase, as its own CLI runs with them."""
    cli = PulumiCli(run.workdir, toolchain_bin(), run.workdir / "secrets" / "pulumi_passphrase")
    return {**{k: v for k, v in run.environment().items() if not k.startswith("PULUMI_")}, **cli.env()}


def _scheduler(run, log: Path) -> subprocess.Popen:
    """`kimi-cluster schedule` in the cluster's project folder, in a session of its own (a killed scheduler leaves
    its pulumi behind, as a crash would)."""
    argv = [str(Path(sys.executable).with_name("kimi-cluster")), "schedule", "--stack", "sandbox",
            "--poll-seconds", str(POLL_S), "--margin", str(MARGIN), "--retry-seconds", "2",
            "--state-dir", str(run.workdir / "scheduler")]
    return subprocess.Popen(argv, cwd=run.workdir / "projects" / "cluster", env=_env(run), stdout=log.open("a"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _record(run) -> dict[str, Any]:
    try:
        return json.loads((run.workdir / "scheduler" / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def _up_for(run, opens: float) -> dict[str, Any] | None:
    """The scheduler's record of the up for the window opening at `opens` (real time)."""
    key = datetime.fromtimestamp(opens, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return next((u for u in _record(run).get("ups") or [] if u.get("opening") == key), None)


def _ask(outputs: dict[str, Any], ca: Path, timeout: float = 30) -> requests.Response:
    return requests.post(outputs["openai_base_url"] + "/chat/completions", timeout=timeout, verify=str(ca),
                         headers={"Authorization": f"Bearer {outputs['api_key']}"},
                         json={"model": outputs["served_model_name"], "max_tokens": 8,
                               "messages": [{"role": "user", "content": "What is 2 + 2?"}]})


def _schedule(epoch: float, day: datetime, windows: list[tuple[int, int]]) -> dict[str, Any]:
    """kimi-cluster:schedule with windows on `day` as minutes of its test clock."""
    weekday = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"][day.weekday()]
    return {"timeZone": "UTC", "testClockEpoch": epoch, "windows": [
        {"days": [weekday], "start": f"{w[0] // 60:02d}:{w[0] % 60:02d}", "end": f"{w[1] // 60:02d}:{w[1] % 60:02d}"}
        for w in windows]}


def _bringup(run) -> float:
    """The sandbox's bring-up as the scheduler reads it when no scheduled up was measured yet: the timeline in the
    stack's export (`pulumi stack export`, as the Automation API gives it to the scheduler)."""
    export = subprocess.run([str(toolchain_bin() / "pulumi"), "stack", "export", "--stack", "sandbox"],
                            cwd=run.workdir / "projects" / "cluster", env=_env(run), capture_output=True, text=True,
                            timeout=120)
    assert export.returncode == 0, export.stderr
    seconds = bringup_seconds(json.loads(export.stdout))
    assert seconds, "no step marks in the bring-up's timeline"
    return seconds


def test_the_scheduler_starts_it_before_each_window_and_the_caretaker_stops_it_after(sandbox) -> None:
    run = sandbox()
    epoch, day = _test_clock(time.time())
    # Windows 8 and 15 hours of the test clock away (8 and 15 minutes): the stack comes up long before them.
    later = _schedule(epoch, day, [(9 * 60, 10 * 60), (16 * 60, 17 * 60)])
    timing = json.dumps({"pollSeconds": POLL_S, "minuteSeconds": 1})
    up = run("up", "--topology", "b300x1-vllm", "--config", "replicas=2", "--config", f"caretakerTiming={timing}",
             "--config", f"schedule={json.dumps(later)}")
    ok(up)
    outputs = run.outputs()
    assert outputs["caretaker_vm"] == FRONT and outputs["schedule"]["clock"]["scale"] == 60
    ca = run.workdir / "endpoint-ca.crt"
    ca.write_text(outputs["ca_certificate"])

    plan = subprocess.run([str(Path(sys.executable).with_name("kimi-cluster")), "plan", "--stack", "sandbox"],
                          cwd=run.workdir / "projects" / "cluster", env=_env(run), capture_output=True, text=True,
                          timeout=120)
    assert "2 of 168 hours a week, in UTC" in plan.stdout and "all week" in plan.stdout, plan.stdout + plan.stderr

    # The windows moved near, from what this bring-up measured (the sandbox's `up --config`, which keeps the
    # schedule for `status` too). The first opens MARGIN bring-ups' wall time from now, as the scheduler's own lead
    # has a margin: in it, that up changes the caretaker's config on the front, and the scheduler's first up changes
    # nothing and verifies. One bring-up was too near once the load rose after it was measured (two suites side by
    # side). The second opens the scheduler's own lead after the first one's stop, so its up begins once the stop is
    # done.
    lead, lead_from = scheduler_lead(Record(run.workdir / "scheduler"), _bringup(run), 0.0, Timing(POLL_S, MARGIN))
    epoch, day = _test_clock(time.time())  # 01:00 now: minute 60 of the day
    first_open = 60 + math.ceil(MARGIN * up.seconds)
    first_minutes = (first_open, first_open + WINDOW_S)
    second_minutes = (first_minutes[1] + STOP_S + math.ceil(lead), 24 * 60)  # to 24:00, the day's end
    assert second_minutes[0] + LAST_WINDOW_S <= 24 * 60, f"the windows do not fit in a day: {second_minutes}"
    opens = [_real(epoch, day.replace(hour=m[0] // 60, minute=m[0] % 60)) for m in (first_minutes, second_minutes)]
    closes = [_real(epoch, day.replace(hour=first_minutes[1] // 60, minute=first_minutes[1] % 60))]
    moved = run("up", "--config", f"schedule={json.dumps(_schedule(epoch, day, [first_minutes, second_minutes]))}")
    ok(moved)
    assert "0 created" in moved.output, moved.output

    log = run.workdir / "scheduler.log"
    scheduler = _scheduler(run, log)
    try:
        # The first window: the scheduler's up (nothing to create) and verify, before it opens.
        entry = wait_for("the first window's scheduled up", lambda: _up_for(run, opens[0]), opens[0] - time.time())
        assert entry["outcome"] == "ok" and entry["verified"] and entry["ready_before_open"], (entry, log.read_text())
        # The scheduler's lead is the one the windows were placed by: the up that moved them left the bring-up as
        # the timeline measures it.
        assert f"(lead {lead / 60:.1f} min: {lead_from})" in log.read_text(), (lead, lead_from, log.read_text())
        _until("the first window to open", opens[0])
        assert _ask(outputs, ca, timeout=WINDOW_S).status_code == 200  # answered before the window's end
        assert _gpu_vms(run) == GPU

        # Its end: the caretaker deletes both replicas; the front answers 503 with the next window's start.
        _until("the first window to close", closes[0])
        wait_for("the stop at the window's end", lambda: _gpu_vms(run) == [], STOP_S, interval=0.2)
        stopped_after = time.time() - closes[0]
        closed = _ask(outputs, ca)
        assert closed.status_code == 503, closed.text
        error = closed.json()["error"]
        assert error["reason"] == "hours" and error["type"] == "cluster_stopped", error
        retry_after = parsedate_to_datetime(closed.headers["Retry-After"]).timestamp()
        assert abs(retry_after - opens[1]) <= 1.0, (closed.headers["Retry-After"], opens[1])
        health = requests.get(outputs["endpoint_url"] + "/health", timeout=10, verify=str(ca))
        assert health.status_code == 503 and health.headers["Retry-After"] == closed.headers["Retry-After"]

        # The second window: the scheduler's up brings the replicas back; killed in the middle of it, it is
        # started again and finishes it.
        wait_for("the second window's up to create a replica", lambda: _record(run).get("current") and any(
            v["name"] in GPU for v in run.emulator().inventory()["virtual_machines"]), opens[1] - time.time(),
            interval=0.2)
        os.kill(scheduler.pid, signal.SIGKILL)  # the scheduler only: its pulumi is left running, as after a crash
        scheduler.wait(30)
        killed_at = time.time()
        scheduler = _scheduler(run, log)
        entry = wait_for("the second window's scheduled up", lambda: _up_for(run, opens[1]),
                         opens[1] - time.time() + 60)
        assert entry["outcome"] == "ok" and entry["verified"] and entry["resumed_after"], (entry, log.read_text())
        # (What the killed up had created already, the resumed one does not create again: its count may be 0.)
        assert entry["ready_before_open"] and entry["attempts"] == 1 and not entry["errors"], (entry, log.read_text())
        vms = sorted(v["name"] for v in run.emulator().inventory()["virtual_machines"])
        assert vms == sorted(GPU + [FRONT]), vms  # each VM once: nothing the killed up began is orphaned
        _until("the second window to open", opens[1])
        assert _ask(outputs, ca).status_code == 200
        status = ok(run("status"))
        assert "working hours: open" in status, status
    finally:
        if scheduler.poll() is None:
            os.killpg(scheduler.pid, signal.SIGTERM)
            scheduler.wait(60)
    text = log.read_text()
    assert "was not finished (the scheduler was stopped)" in text, text
    assert "emulator: nothing left" in ok(run("destroy"))
    assert leftover_processes(run.workdir) == []
    report(f"working hours flow (2 x b300x1-vllm, 1-s minutes): up {up.seconds:.1f} s, windows moved by an up of "
           f"{moved.seconds:.1f} s; lead {lead:.0f} s "
           f"({lead_from}); first window's up done {opens[0] - _ts(_up_for(run, opens[0])['ended']):.1f} s before "
           f"it opened; replicas deleted {stopped_after:.1f} s after it closed; second window's up (killed once at "
           f"{killed_at - opens[1]:+.1f} s, restarted) done {opens[1] - _ts(_up_for(run, opens[1])['ended']):.1f} s "
           "before it opened")


def _until(what: str, moment: float) -> None:
    """Waits for a moment of the schedule (its clock, not a guess)."""
    wait_for(what, lambda: time.time() >= moment, max(moment - time.time(), 0) + 30, interval=0.05)


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
