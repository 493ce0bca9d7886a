"""Working hours in the sandbox, under the real Pulumi CLI and Pulumi's Automation API: 2 x b300x1-vllm behind a
front (the caretaker on the front, which stays and answers the 503), kimi-cluster:schedule on the sandbox's test
clock (schedule.testClockEpoch: one sandbox minute is one second, so an hour's window is a minute long).

- `kimi-cluster schedule` (the scheduler, a process of its own) starts an up one bring-up ahead of the first window
  (the stack is up already: its up creates nothing) and its verify passes before the window opens; the endpoint
  answers at the window's start;
- at the window's end the caretaker deletes both replicas within a poll or two; the front answers 503 with the
  next window's start as Retry-After;
- the scheduler brings the replicas back ahead of the next window; killed in the middle of that up and started
  again, it finishes the bring-up with no VM twice and nothing left running; the endpoint answers at that window's
  start.
"""

from __future__ import annotations

import json
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

from kimi_cluster.sandbox.pulumi_cli import PulumiCli, toolchain_bin

from .conftest import leftover_processes, ok, report, wait_for

pytestmark = [pytest.mark.flow, pytest.mark.timeout(1800)]

GPU = ["kimi-sandbox-node0", "kimi-sandbox-r1-node0"]
FRONT = "kimi-sandbox-front"
MARGIN = "3"  # the lead is 4 bring-ups: the killed up's recovery (cancel, refresh) and its second up fit in it


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
            "--poll-seconds", "1", "--margin", MARGIN, "--retry-seconds", "2",
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


def _ask(outputs: dict[str, Any], ca: Path) -> requests.Response:
    return requests.post(outputs["openai_base_url"] + "/chat/completions", timeout=30, verify=str(ca),
                         headers={"Authorization": f"Bearer {outputs['api_key']}"},
                         json={"model": outputs["served_model_name"], "max_tokens": 8,
                               "messages": [{"role": "user", "content": "What is 2 + 2?"}]})


def test_the_scheduler_starts_it_before_each_window_and_the_caretaker_stops_it_after(sandbox) -> None:
    run = sandbox()
    epoch, day = _test_clock(time.time())
    first = (day.replace(hour=9), day.replace(hour=10))  # schedule time; each hour is a real minute
    second = (day.replace(hour=16), day.replace(hour=17))
    weekday = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"][day.weekday()]
    schedule = {"timeZone": "UTC", "testClockEpoch": epoch, "windows": [
        {"days": [weekday], "start": f"{w[0]:%H:%M}", "end": f"{w[1]:%H:%M}"} for w in (first, second)]}
    timing = json.dumps({"pollSeconds": 1, "minuteSeconds": 1})
    up = run("up", "--topology", "b300x1-vllm", "--config", "replicas=2", "--config", f"caretakerTiming={timing}",
             "--config", f"schedule={json.dumps(schedule)}")
    ok(up)
    outputs = run.outputs()
    assert outputs["caretaker_vm"] == FRONT and outputs["schedule"]["clock"]["scale"] == 60
    ca = run.workdir / "endpoint-ca.crt"
    ca.write_text(outputs["ca_certificate"])
    opens = [_real(epoch, w[0]) for w in (first, second)]
    closes = [_real(epoch, w[1]) for w in (first, second)]
    assert time.time() < opens[0] - 60, "the first up outlasted the time before the first window"

    plan = subprocess.run([str(Path(sys.executable).with_name("kimi-cluster")), "plan", "--stack", "sandbox"],
                          cwd=run.workdir / "projects" / "cluster", env=_env(run), capture_output=True, text=True,
                          timeout=120)
    assert "2 of 168 hours a week, in UTC" in plan.stdout and "all week" in plan.stdout, plan.stdout + plan.stderr

    log = run.workdir / "scheduler.log"
    scheduler = _scheduler(run, log)
    try:
        # The first window: the scheduler's up (nothing to create) and verify, before it opens.
        entry = wait_for("the first window's scheduled up", lambda: _up_for(run, opens[0]), opens[0] - time.time())
        assert entry["outcome"] == "ok" and entry["verified"] and entry["ready_before_open"], (entry, log.read_text())
        _until("the first window to open", opens[0])
        assert _ask(outputs, ca).status_code == 200
        assert _gpu_vms(run) == GPU

        # Its end: the caretaker deletes both replicas; the front answers 503 with the next window's start.
        _until("the first window to close", closes[0])
        wait_for("the stop at the window's end", lambda: _gpu_vms(run) == [], 60, interval=0.2)
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
    report(f"working hours flow (2 x b300x1-vllm, 1-s minutes): up {up.seconds:.1f} s; first window's up done "
           f"{opens[0] - _ts(_up_for(run, opens[0])['ended']):.1f} s before it opened; replicas deleted "
           f"{stopped_after:.1f} s after it closed; second window's up (killed once at {killed_at - opens[1]:+.1f} s, "
           f"restarted) done {opens[1] - _ts(_up_for(run, opens[1])['ended']):.1f} s before it opened")


def _until(what: str, moment: float) -> None:
    """Waits for a moment of the schedule (its clock, not a guess)."""
    wait_for(what, lambda: time.time() >= moment, max(moment - time.time(), 0) + 30, interval=0.05)


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
