"""`kimi-cluster schedule`'s decisions and record: when to start an `up` so the endpoint serves as a window opens,
one `up` at a time, a failed one retried with a bound, and what it did, kept on the scheduler's host.

The stop is not here: the caretaker on the stack's own VM stops the cluster at a window's end
(kimi_cluster/node/caretaker_hours.py), so no stop depends on this host. This side only starts: one bring-up ahead of
each opening, the lead being this stack's last measured bring-up (the scheduler's own last `up` and verify, else the
steps' marks in the stack's timeline) times (1 + margin), plus one look, or the model before any was measured.

The record (`state.json` in the scheduler's folder, written atomically) holds the up under way: a scheduler killed
mid-`up` finds it when it starts again and runs that `up` again (the VM provider finds a VM by its name, so a create
whose answer was lost adopts the VM instead of making a second one). A lock file held for the process's life keeps a
second scheduler of the same stack on this host from running; Pulumi's own stack lock keeps any other host's `up` out.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from kimi_cluster.node.working_hours import Opening, next_opening, open_now

HISTORY_KEEP = 20
STATE_FILE = "state.json"
LOCK_FILE = "lock"


class SchedulerError(Exception):
    pass


def default_state_dir(stack: str) -> Path:
    """The scheduler's record and lock on its host, unless --state-dir says otherwise."""
    return Path.home() / ".local/state/kimi-cluster/schedule" / stack


class Driver(Protocol):
    """What the scheduler does to the stack: the Automation API's (kimi_cluster/operator/scheduler_driver.py)."""

    def up(self, replicas: int) -> int: ...

    def verify(self) -> tuple[bool, str]: ...

    def recover(self, interrupted: dict[str, Any]) -> str: ...


@dataclass(frozen=True)
class Timing:
    poll_seconds: float = 60.0
    margin: float = 0.25  # the lead is the measured bring-up times 1.25
    attempts: int = 3  # a failed up is tried this many times in all
    retry_seconds: float = 60.0  # between two attempts
    minute_seconds: float = 60.0  # the sandbox's shortened minute (caretakerTiming.minuteSeconds)


@dataclass(frozen=True)
class Decision:
    """What the scheduler does at `at` (or now, when it is past): up for `opening`, or wait for it."""

    action: str  # "up" | "wait" | "done"
    at: datetime
    opening: Opening
    lead_seconds: float
    lead_from: str

    def line(self) -> str:
        when = f"{self.at.astimezone(self.opening.start.tzinfo):%a %Y-%m-%d %H:%M:%S %Z}"
        if self.action == "done":
            return f"the window {self.opening.describe()} is served: nothing to do until it closes"
        return (f"{'up now' if self.action == 'up' else 'up at ' + when} for the window "
                f"{self.opening.describe()} opening {self.opening.start:%a %Y-%m-%d %H:%M %Z} (lead "
                f"{self.lead_seconds / 60:.1f} min: {self.lead_from})")


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Record:
    """The scheduler's own record, in its folder; one writer (the lock holder)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / STATE_FILE
        self.data: dict[str, Any] = {"ups": [], "current": None}
        try:
            loaded = json.loads(self.path.read_text())
            if isinstance(loaded, dict):
                self.data.update(loaded)
        except (OSError, ValueError):
            pass

    def save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)

    def served(self, opening: Opening) -> bool:
        """Whether an up for this opening finished (verified or not, or given up after its attempts)."""
        key = _stamp(opening.start)
        # An early start is no window's up: an idle stop after it leaves the window its scheduled up.
        return any(u.get("opening") == key and not u.get("early") for u in self.data["ups"])

    def measured_seconds(self) -> float | None:
        """The last up that brought the cluster up (created something) and passed verify: an up of a stack that
        was up already is no bring-up."""
        done = [u for u in self.data["ups"] if u.get("outcome") == "ok" and u.get("seconds") and u.get("created")]
        return float(done[-1]["seconds"]) if done else None


def lead(record: Record, timeline_seconds: float | None, modelled_seconds: float,
         timing: Timing) -> tuple[float, str]:
    """How long before a window opens the up starts, and from what."""
    measured = record.measured_seconds()
    if measured is not None:
        base, source = measured, f"this stack's last scheduled up and verify, {measured / 60:.1f} min"
    elif timeline_seconds is not None:
        base, source = timeline_seconds, f"this stack's last bring-up in its timeline, {timeline_seconds / 60:.1f} min"
    else:
        base, source = modelled_seconds, f"the model's bring-up, {modelled_seconds / 60:.1f} min (none measured yet)"
    return base * (1 + timing.margin) + timing.poll_seconds, f"{source}, +{timing.margin:.0%} and one look"


def decide(schedule: dict[str, Any], now: datetime, record: Record, lead_seconds: float,
           lead_from: str) -> Decision:
    """The next thing to do: the open window's up when it had none (a scheduler started late), else the next
    window's, at its start less the lead."""
    current = open_now(schedule, now)
    if current is not None:
        if record.served(current):
            return Decision("done", now, current, lead_seconds, lead_from)
        return Decision("up", now, current, lead_seconds, lead_from)
    following = next_opening(schedule, now)
    if following is None:
        raise SchedulerError("the schedule has no window")
    at = following.start - timedelta(seconds=lead_seconds)
    if record.served(following):
        return Decision("done", now, following, lead_seconds, lead_from)
    return Decision("up" if now >= at else "wait", at, following, lead_seconds, lead_from)


def hold_lock(folder: Path) -> Any:
    """The scheduler's lock for this stack on this host, held while the returned file stays open."""
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / LOCK_FILE, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip()
        handle.close()
        raise SchedulerError(f"another scheduler runs for this stack ({holder or 'pid unknown'}, lock "
                             f"{folder / LOCK_FILE}): two would start two ups") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} since {_stamp(datetime.now(UTC))}\n")
    handle.flush()
    return handle


def bring_up(driver: Driver, record: Record, decision: Decision, timing: Timing,
             say: Callable[[str], None], sleep: Callable[[float], None] = time.sleep,
             early: bool = False) -> dict[str, Any]:
    """One opening's up: attempts up to the bound, then verify; recorded before, between and after. `early`: asked
    for ahead of the window (kimi_cluster/operator/early_start.py), with that window's replicas."""
    interrupted = record.data.get("current")
    started = time.time()
    entry: dict[str, Any] = {"opening": _stamp(decision.opening.start), "window": decision.opening.describe(),
                             "replicas": decision.opening.replicas, "started": _stamp(datetime.now(UTC)),
                             "attempts": 0, "errors": [], "pid": os.getpid(), "pgid": os.getpgrp()} \
        | ({"early": True} if early or (interrupted or {}).get("early") else {})
    if interrupted:
        # The last scheduler died in the middle of an up: its pulumi may still hold the stack's lock.
        entry["resumed_after"] = interrupted
        say(f"an up begun at {interrupted.get('started')} was not finished (the scheduler was stopped); "
            f"{driver.recover(interrupted)}")
    record.data["current"] = entry
    record.save()
    for attempt in range(1, timing.attempts + 1):
        entry["attempts"] = attempt
        record.save()
        say(f"up, attempt {attempt} of {timing.attempts}: {decision.line()}")
        try:
            entry["created"] = driver.up(decision.opening.replicas)
            break
        except Exception as err:  # noqa: BLE001  # any failure of the up is retried, and reported with its text
            entry["errors"] = (entry["errors"] + [f"attempt {attempt}: {str(err)[-600:]}"])[-timing.attempts:]
            say(f"up failed (attempt {attempt} of {timing.attempts}): {str(err).strip().splitlines()[-1][:300]}")
            if attempt < timing.attempts:
                sleep(timing.retry_seconds)
    else:
        entry.update(outcome="failed", seconds=round(time.time() - started, 1), ended=_stamp(datetime.now(UTC)))
        return _finish(record, entry, say, f"up failed {timing.attempts} times; the window "
                       f"{decision.opening.describe()} will not be served unless someone runs `pulumi up`")
    passed, detail = driver.verify()
    ended = datetime.now(UTC)
    entry.update(outcome="ok" if passed else "unverified", verified=passed, verify=detail[-600:],
                 seconds=round(time.time() - started, 1), ended=_stamp(ended),
                 ready_before_open=ended <= decision.opening.start,
                 margin_seconds=round((decision.opening.start - ended).total_seconds(), 1))
    return _finish(record, entry, say, f"up done in {entry['seconds'] / 60:.1f} min, verify "
                   f"{'passed' if passed else 'FAILED: ' + detail[-300:]}; the window opens "
                   f"{entry['margin_seconds']:+.0f} s from now")


def _finish(record: Record, entry: dict[str, Any], say: Callable[[str], None], line: str) -> dict[str, Any]:
    record.data["ups"] = (record.data["ups"] + [entry])[-HISTORY_KEEP:]
    record.data["current"] = None
    record.save()
    say(line)
    return entry


def run(schedule: dict[str, Any], driver: Driver, record: Record, timing: Timing, lead_of: Callable[[], tuple[
        float, str]], say: Callable[[str], None], once: bool = False,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        early: Callable[[Decision], tuple[bool, str]] | None = None) -> int:
    """Look every poll: an up when one is due, else wait. `once`: one look (a timer's run), then exit. `early`:
    while it waits, whether an early start was asked for (and what to say), schedule.earlyStart's."""
    said = early_said = ""
    while True:
        lead_seconds, lead_from = lead_of()
        decision = decide(schedule, clock(), record, lead_seconds, lead_from)
        interrupted = record.data.get("current")
        if interrupted and interrupted.get("opening") != _stamp(decision.opening.start):
            # Killed in the middle of an up for a window that has since closed: recorded, not run again.
            _finish(record, {**interrupted, "outcome": "interrupted"}, say,
                    f"the up begun at {interrupted.get('started')} was interrupted; its window has passed")
            interrupted = None
        if decision.action == "up" or interrupted:
            bring_up(driver, record, decision, timing, say)
        elif early is not None and decision.action == "wait" and (asked := early(decision)) \
                and (asked[0] or asked[1] != early_said):
            early_said = asked[1]
            say(asked[1])
            if asked[0]:
                bring_up(driver, record, decision, timing, say, early=True)
        elif once or decision.line() != said:
            said = decision.line()  # said once, not at every look
            say(said)
        if once:
            return 0
        time.sleep(timing.poll_seconds)
