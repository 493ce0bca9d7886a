"""`kimi-cluster schedule` (kimi_cluster/operator/scheduler.py, kimi_cluster/cli/schedule.py): when it starts an up
and from which lead, one up per opening, a failed up retried with a bound and reported, an up cut off by a kill run
again after a restart, the lock that keeps a second scheduler out, and --dry-run and --print touching nothing.
The driver here is a recording one; the Automation API's is driven by the sandbox flow.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kimi_cluster.operator import scheduler
from tests.caretaker.test_working_hours_render import SECRET

BERLIN = {"time_zone": "Europe/Berlin", "windows": [{"days": [0, 1, 2, 3, 4], "start": "08:00", "end": "19:00",
                                                     "replicas": 2}]}
MONDAY_0500_UTC = datetime(2026, 3, 30, 5, 0, tzinfo=UTC)  # 07:00 CEST: the window opens at 06:00 UTC
TIMING = scheduler.Timing(poll_seconds=60, margin=0.25, attempts=3, retry_seconds=0)


class Driver:
    def __init__(self, fail_times: int = 0, verified: bool = True) -> None:
        self.fail_times, self.verified = fail_times, verified
        self.ups: list[int] = []
        self.recovered: list[dict[str, Any]] = []

    def up(self, replicas: int) -> int:
        self.ups.append(replicas)
        if len(self.ups) <= self.fail_times:
            raise RuntimeError(f"error: update failed\nthe API answered 503 (attempt {len(self.ups)})")
        return 3

    def verify(self) -> tuple[bool, str]:
        return self.verified, "12 checks: all passed" if self.verified else "1 failed: chat"

    def recover(self, interrupted: dict[str, Any]) -> str:
        self.recovered.append(interrupted)
        return "recovered"


def test_the_lead_is_the_last_measured_up_else_the_timeline_else_the_model(tmp_path):
    record = scheduler.Record(tmp_path)
    seconds, source = scheduler.lead(record, None, 1800, TIMING)
    assert seconds == 1800 * 1.25 + 60 and "the model's bring-up, 30.0 min (none measured yet)" in source
    seconds, source = scheduler.lead(record, 1200, 1800, TIMING)
    assert seconds == 1200 * 1.25 + 60 and "timeline, 20.0 min" in source
    record.data["ups"] = [{"opening": "x", "outcome": "ok", "seconds": 600, "created": 3},
                          {"opening": "y", "outcome": "failed", "seconds": 5},
                          {"opening": "z", "outcome": "ok", "seconds": 20, "created": 0}]  # up already: no bring-up
    seconds, source = scheduler.lead(record, 1200, 1800, TIMING)
    assert seconds == 600 * 1.25 + 60 and "last scheduled up and verify, 10.0 min" in source


def test_it_waits_then_starts_one_lead_ahead_and_once_per_opening(tmp_path):
    record = scheduler.Record(tmp_path)
    lead = 40 * 60
    early = scheduler.decide(BERLIN, MONDAY_0500_UTC, record, lead, "model")
    assert early.action == "wait" and early.at == datetime(2026, 3, 30, 5, 20, tzinfo=UTC)
    assert "up at Mon 2026-03-30 07:20:00 CEST for the window mon 08:00-19:00 CEST (2 replicas)" in early.line()
    due = scheduler.decide(BERLIN, MONDAY_0500_UTC + timedelta(minutes=20), record, lead, "model")
    assert due.action == "up" and due.opening.replicas == 2
    driver = Driver()
    entry = scheduler.bring_up(driver, record, due, TIMING, lambda _: None)
    assert driver.ups == [2] and entry["outcome"] == "ok" and entry["verified"] and entry["attempts"] == 1
    assert json.loads((tmp_path / scheduler.STATE_FILE).read_text())["current"] is None
    # Served: no second up for that opening, inside it either (an idle stop inside a window stays a stop).
    assert scheduler.decide(BERLIN, MONDAY_0500_UTC + timedelta(minutes=30), record, lead, "m").action == "done"
    assert scheduler.decide(BERLIN, MONDAY_0500_UTC + timedelta(hours=5), record, lead, "m").action == "done"
    # The next day's opening is due again.
    tuesday = scheduler.decide(BERLIN, MONDAY_0500_UTC + timedelta(days=1, minutes=25), record, lead, "m")
    assert tuesday.action == "up" and tuesday.opening.start.day == 31
    # A scheduler started inside a window that had no up starts one at once.
    late = scheduler.decide(BERLIN, MONDAY_0500_UTC + timedelta(days=2, hours=3), record, lead, "m")
    assert late.action == "up" and late.opening.start.day == 1


def test_a_failed_up_is_retried_with_a_bound_and_reported(tmp_path):
    record = scheduler.Record(tmp_path)
    decision = scheduler.decide(BERLIN, MONDAY_0500_UTC + timedelta(minutes=59), record, 600, "m")
    said: list[str] = []
    driver = Driver(fail_times=2)
    entry = scheduler.bring_up(driver, record, decision, TIMING, said.append, sleep=lambda _: None)
    assert driver.ups == [2, 2, 2] and entry["outcome"] == "ok" and entry["attempts"] == 3
    assert [e.split(":")[0] for e in entry["errors"]] == ["attempt 1", "attempt 2"]
    assert any("up failed (attempt 1 of 3): the API answered 503 (attempt 1)" in s for s in said)
    record2 = scheduler.Record(tmp_path / "b")
    never = Driver(fail_times=99)
    entry = scheduler.bring_up(never, record2, decision, TIMING, said.append, sleep=lambda _: None)
    assert len(never.ups) == 3 and entry["outcome"] == "failed"
    assert "up failed 3 times; the window mon 08:00-19:00 CEST (2 replicas) will not be served" in said[-1]
    assert record2.served(decision.opening)  # reported once, not retried forever


def test_an_up_cut_off_by_a_kill_is_run_again_after_the_restart(tmp_path):
    record = scheduler.Record(tmp_path)
    decision = scheduler.decide(BERLIN, MONDAY_0500_UTC + timedelta(minutes=59), record, 600, "m")

    class Killed(Driver):
        def up(self, replicas: int) -> int:
            raise KeyboardInterrupt  # the process ends here; only what was saved before remains

    with pytest.raises(KeyboardInterrupt):
        scheduler.bring_up(Killed(), record, decision, TIMING, lambda _: None)
    restarted = scheduler.Record(tmp_path)
    assert restarted.data["current"]["opening"] == "2026-03-30T06:00:00Z"
    driver = Driver()
    scheduler.run(BERLIN, driver, restarted, TIMING, lambda: (600, "m"), lambda _: None, once=True,
                  clock=lambda: MONDAY_0500_UTC + timedelta(minutes=59))
    assert driver.recovered and driver.recovered[0]["opening"] == "2026-03-30T06:00:00Z" and driver.ups == [2]
    entry = restarted.data["ups"][-1]
    assert entry["outcome"] == "ok" and entry["resumed_after"]["started"] and restarted.data["current"] is None
    # Cut off for a window that has passed by the restart: recorded as interrupted, not run again.
    stale = scheduler.Record(tmp_path / "c")
    stale.data["current"] = {"opening": "2026-03-23T06:00:00Z", "started": "2026-03-23T05:30:00Z"}
    idle = Driver()
    scheduler.run(BERLIN, idle, stale, TIMING, lambda: (600, "m"), lambda _: None, once=True,
                  clock=lambda: MONDAY_0500_UTC)
    assert idle.ups == [] and stale.data["ups"][-1]["outcome"] == "interrupted" and stale.data["current"] is None


def test_a_second_scheduler_of_the_stack_is_refused_by_the_lock(tmp_path):
    held = scheduler.hold_lock(tmp_path)
    code = textwrap.dedent(f"""
        from pathlib import Path
        from kimi_cluster.operator import scheduler
        try:
            scheduler.hold_lock(Path({str(tmp_path)!r}))
        except scheduler.SchedulerError as err:
            print(err)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "another scheduler runs for this stack (pid" in done.stdout, done.stdout + done.stderr
    held.close()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout == "", done.stdout


STACK_YAML = f"""config:
  kimi-cluster:operatorCidr: 81.2.69.1/32
  kimi-cluster:sshPublicKey: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGtpbWktY2x1c3Rlci10ZXN0LWtleS1ub3QtcmVhbCEh t
  kimi-cluster:topology: b300x1-vllm
  kimi-cluster:caretakerApiKey: {SECRET}
  kimi-cluster:schedule:
    timeZone: Europe/Berlin
    windows:
      - days: [mon, tue, wed, thu, fri, sat, sun]
        start: "08:00"
        end: "19:00"
"""


def _cli(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "Pulumi.dev.yaml").write_text(STACK_YAML)
    return subprocess.run([sys.executable, "-m", "kimi_cluster.cli.main", "schedule", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_dry_run_prints_a_week_of_ups_and_touches_nothing(tmp_path):
    state = tmp_path / "state"
    done = _cli(tmp_path, "--dry-run", "--state-dir", str(state))
    assert done.returncode == 0, done.stderr
    ups = [line for line in done.stdout.splitlines() if line.startswith("up at ")]
    assert 6 <= len(ups) <= 7 and all("08:00-19:00 CE" in line and "(1 replica)" in line for line in ups)
    assert "the model's bring-up" in done.stdout and "dry run: nothing was started, locked or recorded" in done.stdout
    assert not state.exists()


@pytest.mark.parametrize(("kind", "expect"), [("systemd", "Restart=always"), ("cron", "* * * * cd "),
                                              ("ci", "concurrency: kimi-schedule-dev")])
def test_it_prints_what_to_install(tmp_path, kind, expect):
    done = _cli(tmp_path, "--print", kind)
    assert done.returncode == 0 and expect in done.stdout and "schedule --stack dev" in done.stdout, done.stderr
    assert SECRET not in done.stdout


def test_a_stack_without_a_schedule_has_nothing_to_start(tmp_path):
    (tmp_path / "Pulumi.dev.yaml").write_text(STACK_YAML.split("  kimi-cluster:schedule:")[0])
    done = subprocess.run([sys.executable, "-m", "kimi_cluster.cli.main", "schedule", "--dry-run"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "has no kimi-cluster:schedule" in done.stderr


@pytest.mark.parametrize("export", ["cli fails", "not a deployment"])
def test_a_stack_whose_bringup_cannot_be_read_leaves_the_lead_to_the_model(export: str) -> None:
    from types import SimpleNamespace

    from pulumi.automation import CommandError
    from pulumi.automation._cmd import CommandResult

    from kimi_cluster.cli.schedule import _timeline_seconds

    def export_stack() -> Any:
        if export == "cli fails":
            raise CommandError(CommandResult("", "error: no stack named 'kimi-cluster/prod' found", 255))
        return SimpleNamespace(deployment=["resources"])

    assert _timeline_seconds(SimpleNamespace(stack=SimpleNamespace(export_stack=export_stack))) is None
