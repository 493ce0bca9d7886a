"""Working hours' starter: brings the stack up one bring-up ahead of each window of kimi-cluster:schedule.

    kimi-cluster schedule [--stack NAME] [--dry-run] [--once] [--print systemd|cron|ci]

Run it from the Pulumi project's folder on an always-on host that reaches the stack's backend (logged in as for
`pulumi up`, with the same secrets passphrase or provider and the cloud's API key): it drives the stack with Pulumi's
Automation API and checks the endpoint before each window opens. The stop is the caretaker's, on the stack's own VM;
nothing here is needed for it. The host's clock and time zone are taken as they are (the windows are in the
schedule's own zone). Its record and lock are in --state-dir (default ~/.local/state/kimi-cluster/schedule/<stack>).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kimi_cluster.blueprint.caretaker import schedule_of
from kimi_cluster.node.working_hours import next_opening, open_now
from kimi_cluster.operator import scheduler
from kimi_cluster.settings import SettingsError
from kimi_cluster.settings.loader import load_settings, plain_credentials_in, read_stack_file


def say(line: str) -> None:
    print(f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ} {line}", flush=True)


def _timeline_seconds(driver: Any) -> float | None:
    """The stack's last bring-up as its GPU nodes' step marks show it (kimi-cluster timeline's bars)."""
    from pulumi.automation import CommandError

    from kimi_cluster.operator.timeline_report import TimelineError, bringup_seconds

    try:
        export = driver.stack.export_stack()
        return bringup_seconds({"deployment": export.deployment})
    except (CommandError, TimelineError):  # no export, or one the timeline cannot read: the model's lead then
        return None


def _schedule_lines(command: str, poll_minutes: int, stack: str, folder: str) -> dict[str, str]:
    """What to install on the host: a systemd service (the scheduler running, restarted when it dies), the same
    as a timer of one look each poll, a crontab line, and a CI schedule; each from this folder, with its env."""
    once = f"{command} --once"
    return {
        "systemd": f"""# /etc/systemd/system/kimi-schedule-{stack}.service
# (systemctl enable --now kimi-schedule-{stack})
[Unit]
Description=kimi-cluster schedule for stack {stack}
After=network-online.target

[Service]
WorkingDirectory={folder}
# The backend's login, the secrets passphrase and HYPERSTACK_API_KEY, as `pulumi up` needs them, root-only:
EnvironmentFile=/etc/kimi-cluster/schedule-{stack}.env
ExecStart={command}
Restart=always
RestartSec=30
# A stop or a restart ends the pulumi it started too (the next start runs an interrupted up again).
KillMode=control-group

[Install]
WantedBy=multi-user.target

# Or a timer of one look every {poll_minutes} min (the service above with ExecStart={once} and Type=oneshot):
# /etc/systemd/system/kimi-schedule-{stack}.timer
[Timer]
OnCalendar=*:0/{poll_minutes}
Persistent=true

[Install]
WantedBy=timers.target
""",
        "cron": (f"# crontab -e (a look every {poll_minutes} min; a look while an up runs finds the lock and exits)\n"
                 f"*/{poll_minutes} * * * * cd {shlex.quote(folder)} && . /etc/kimi-cluster/schedule-{stack}.env && "
                 f"{once} >> ~/kimi-schedule-{stack}.log 2>&1\n"),
        "ci": f"""# .github/workflows/kimi-schedule-{stack}.yml: GitHub's schedule runs late under load (minutes),
# and its runner keeps no record between runs: keep --state-dir in a cache, and count the delay into the margin.
on:
  schedule:
    - cron: "*/{poll_minutes} * * * *"
concurrency: kimi-schedule-{stack}  # never two runs, so never two ups
jobs:
  look:
    runs-on: ubuntu-latest
    timeout-minutes: 120
    steps:
      - uses: actions/checkout@v4
      - uses: actions/cache@v4
        with:
          path: .kimi-schedule
          key: kimi-schedule-{stack}-${{{{ github.run_id }}}}
          restore-keys: kimi-schedule-{stack}-
      - run: pip install -e . && {once} --state-dir .kimi-schedule
        env:
          PULUMI_ACCESS_TOKEN: ${{{{ secrets.PULUMI_ACCESS_TOKEN }}}}
          HYPERSTACK_API_KEY: ${{{{ secrets.HYPERSTACK_API_KEY }}}}
""",
    }


def dry_run(schedule: dict[str, Any], record: scheduler.Record, lead_seconds: float, lead_from: str,
            days: int = 7) -> list[str]:
    """What it would do over the next `days`, and when; nothing is touched."""
    now = datetime.now(UTC)
    lines = [f"now {now:%a %Y-%m-%d %H:%M:%S %Z}; lead {lead_seconds / 60:.1f} min ({lead_from})"]
    current = open_now(schedule, now)
    if current is not None:
        done = record.served(current)
        lines.append(f"open now: {current.describe()} until {current.end:%H:%M %Z}; "
                     + ("its up was done" if done else "no up recorded for it: the scheduler would start one now"))
    at = now
    while True:
        opening = next_opening(schedule, at)
        if opening is None or opening.start > now + timedelta(days=days):
            break
        up_at = opening.start - timedelta(seconds=lead_seconds)
        lines.append(f"up at {up_at.astimezone(opening.start.tzinfo):%a %Y-%m-%d %H:%M %Z} (verify before "
                     f"{opening.start:%H:%M}) for {opening.describe()}; the caretaker stops it at "
                     f"{opening.end:%H:%M %Z}")
        at = opening.start
    lines.append("dry run: nothing was started, locked or recorded")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kimi-cluster schedule", description=__doc__.splitlines()[0])
    ap.add_argument("--stack", default="dev", help="the stack (Pulumi.<stack>.yaml in this folder; default dev)")
    ap.add_argument("--dry-run", action="store_true", help="print what it would do and when; act on nothing")
    ap.add_argument("--once", action="store_true", help="one look (an up when one is due), then exit: for a timer")
    ap.add_argument("--print", choices=("systemd", "cron", "ci"), dest="print_kind",
                    help="print a systemd unit and timer, a crontab line or a CI schedule to install, and exit")
    ap.add_argument("--state-dir", help="its record and lock (default ~/.local/state/kimi-cluster/schedule/<stack>)")
    ap.add_argument("--poll-seconds", type=float, default=60.0, help="how often it looks (default 60)")
    ap.add_argument("--margin", type=float, default=0.25, help="the lead over the measured bring-up (default 0.25)")
    ap.add_argument("--attempts", type=int, default=3, help="a failed up is tried this many times in all")
    ap.add_argument("--retry-seconds", type=float, default=60.0, help="between two attempts (default 60)")
    args = ap.parse_args(argv)
    if not (1 <= args.attempts <= 10 and 1 <= args.poll_seconds <= 3600 and 0 <= args.margin <= 5
            and 0 <= args.retry_seconds <= 3600):
        print("error: --attempts 1..10, --poll-seconds 1..3600, --margin 0..5, --retry-seconds 0..3600",
              file=sys.stderr)
        return 2
    folder = os.getcwd()
    path = os.path.join(folder, f"Pulumi.{args.stack}.yaml")
    if not os.path.exists(path):
        print(f"error: no stack config at {path}: run it from the Pulumi project's folder", file=sys.stderr)
        return 2
    try:
        raw, other = read_stack_file(path)
        settings = load_settings(raw, args.stack, plain_credentials_in(
            {**other, **{f"kimi-cluster:{k}": v for k, v in raw.items()}}))
    except SettingsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    schedule = schedule_of(settings)
    if schedule is None:
        print(f"error: the stack {args.stack} has no kimi-cluster:schedule: nothing to start", file=sys.stderr)
        return 1
    entry = os.path.join(os.path.dirname(sys.executable), "kimi-cluster")  # this install's own command
    command = shlex.join([entry, "schedule", "--stack", args.stack])
    if args.print_kind:
        print(_schedule_lines(command, max(1, round(args.poll_seconds / 60)), args.stack, folder)[args.print_kind])
        return 0
    state_dir = Path(args.state_dir) if args.state_dir else scheduler.default_state_dir(args.stack)
    record = scheduler.Record(state_dir)
    timing = scheduler.Timing(args.poll_seconds, args.margin, args.attempts, args.retry_seconds)
    from kimi_cluster.operator.hours_report import modelled_bringup_minutes

    modelled = modelled_bringup_minutes(settings) * 60
    if args.dry_run:
        lead_seconds, lead_from = scheduler.lead(record, None, modelled, timing)
        lines = dry_run(schedule, record, lead_seconds, lead_from)
        if schedule.get("early_start"):
            from kimi_cluster.operator.scheduler_driver import AutomationDriver

            lines[-1:-1] = [early_dry_run(settings, schedule, record, lead_seconds, datetime.now(UTC),
                                          lambda: AutomationDriver(args.stack, folder, say).early_ask())]
        for line in lines:
            print(line)
        return 0
    try:
        lock = scheduler.hold_lock(state_dir)
    except scheduler.SchedulerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 0 if args.once else 1  # a timer's look while the last one still runs its up: nothing to do
    from kimi_cluster.operator.scheduler_driver import AutomationDriver

    driver = AutomationDriver(args.stack, folder, say)
    say(f"schedule for stack {args.stack} in {schedule['time_zone']}: {len(schedule['windows'])} window(s); "
        f"record {record.path}")
    # The timeline is read from the stack's export (a pulumi run): once, and again after each up it may change.
    timeline: dict[int, float | None] = {}

    def lead_now() -> tuple[float, str]:
        ups = len(record.data["ups"])
        if record.measured_seconds() is None and ups not in timeline:
            timeline[ups] = _timeline_seconds(driver)
        return scheduler.lead(record, timeline.get(ups), modelled, timing)

    with lock:
        return scheduler.run(schedule, driver, record, timing, lead_now, say, once=args.once,
                             early=_early(settings, record, driver) if schedule.get("early_start") else None)


def early_dry_run(settings: Any, schedule: dict[str, Any], record: scheduler.Record, lead_seconds: float,
                  now: datetime, read: Any) -> str:
    """What the scheduler would do with the front's pending ask now: read, neither answered nor recorded."""
    from kimi_cluster.blueprint.caretaker import gpu_usd_per_hour
    from kimi_cluster.operator import early_start

    following = next_opening(schedule, now)
    if open_now(schedule, now) is not None or following is None:
        return "early start: a window is open; an ask is read only between windows"
    if record.served(following):
        return f"early start: the window {following.describe()} had its up already; no ask is read until it closes"
    try:
        ask = read()
    except Exception as err:  # noqa: BLE001  # any failure to read the stack or the front is what the dry run reports
        return f"early start: the pending ask could not be read: {str(err).strip()[-300:]}"
    bringup_usd = gpu_usd_per_hour(settings) / settings.replicas * following.replicas * lead_seconds / 3600
    outcome = early_start.answer(ask, record.data.get("early"), bringup_usd)
    return ("early start: no ask pending on the front" if outcome.action == "none" and not outcome.line
            else "early start: " + outcome.line.replace("starting an up now", "the scheduler would start an up now"))


def _early(settings: Any, record: scheduler.Record, driver: Any) -> Any:
    """schedule.earlyStart: each look while waiting reads the front's pending ask and answers it within the budget."""
    from kimi_cluster.blueprint.caretaker import gpu_usd_per_hour
    from kimi_cluster.operator import early_start

    def usd_per_hour(replicas: int) -> float:
        return gpu_usd_per_hour(settings) / settings.replicas * replicas

    def look(decision: scheduler.Decision) -> tuple[bool, str]:
        outcome = early_start.look(record, decision, driver.early_ask, usd_per_hour)
        return outcome.action == "up", outcome.line

    return look


if __name__ == "__main__":
    sys.exit(main())
