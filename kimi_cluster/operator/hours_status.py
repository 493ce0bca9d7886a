"""`status`'s view of the working hours (kimi-cluster:schedule): which window is open, which comes next, the last
scheduled up (the scheduler's record, when it runs on this host) and the last stop at a window's end (the
caretaker's state, read by caretaker_status.py), each with when it ran and how long it took.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from kimi_cluster.node.working_hours import next_opening, open_now
from kimi_cluster.operator.scheduler import STATE_FILE, default_state_dir

RECORD_MAX_BYTES = 1024 * 1024


def _when(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def _took(start: Any, end: Any) -> float | None:
    a, b = _when(start), _when(end)
    return (b - a).total_seconds() if a and b else None


def last_up(stack: str, folder: Path | None = None) -> dict[str, Any] | None:
    """The scheduler's last up on this host, or None (it runs elsewhere, or has not run)."""
    path = (folder or default_state_dir(stack)) / STATE_FILE
    try:
        with open(path, "rb") as handle:
            record = json.loads(handle.read(RECORD_MAX_BYTES))
        ups = record.get("ups") if isinstance(record, dict) else None
    except (OSError, ValueError, RecursionError):
        return None
    current = record.get("current") if isinstance(record, dict) else None
    if isinstance(current, dict):
        return {"running": True, "started": str(current.get("started"))[:40], "window": str(current.get("window"))[:80]}
    if not isinstance(ups, list) or not ups or not isinstance(ups[-1], dict):
        return None
    up = ups[-1]
    return {"running": False, "started": str(up.get("started"))[:40], "window": str(up.get("window"))[:80],
            "outcome": str(up.get("outcome"))[:20], "seconds": _took(up.get("started"), up.get("ended")),
            "verified": up.get("verified") is True, "attempts": up.get("attempts")}


def hours_view(schedule: dict[str, Any] | None, now: datetime, last_stop: dict[str, Any] | None,
               up: dict[str, Any] | None) -> dict[str, Any] | None:
    if schedule is None:
        return None
    current, following = open_now(schedule, now), next_opening(schedule, now)
    stop = None
    if last_stop:
        stop = {**last_stop, "seconds": _took(last_stop.get("started_at"), last_stop.get("done_at"))}
    return {"open": current.describe() if current else None,
            "closes": f"{current.end:%a %H:%M %Z}" if current else None,
            "next": f"{following.describe()} from {following.start:%a %Y-%m-%d %H:%M %Z}" if following else None,
            "last_up": up, "last_stop": stop}


def format_hours_status(view: dict[str, Any] | None) -> list[str]:
    if not view:
        return []
    now = f"open: {view['open']} until {view['closes']}" if view["open"] else "closed"
    lines = [f"working hours: {now}; next {view['next']}"]
    up = view.get("last_up")
    if up and up.get("running"):
        lines.append(f"  scheduled up running since {up['started']} for {up['window']}")
    elif up:
        took = f" in {up['seconds'] / 60:.1f} min" if up.get("seconds") is not None else ""
        verified = "verified" if up.get("verified") else "NOT verified"
        lines.append(f"  last scheduled up {up['started']}{took} for {up['window']}: {up['outcome']}, {verified} "
                     f"({up.get('attempts')} attempt(s))")
    else:
        lines.append("  last scheduled up: no record on this host (the scheduler's record is on the host it runs on)")
    stop = view.get("last_stop")
    if stop:
        took = f", took {stop['seconds']:.0f} s" if stop.get("seconds") is not None else ", deleting"
        lines.append(f"  last stop at a window's end {stop.get('started_at')}{took}: deleted "
                     f"{', '.join(stop.get('deleted') or []) or 'nothing yet'}")
    return lines
