#!/usr/bin/env python3
"""The caretaker with working hours (kimi-cluster:schedule): at a window's end it stops the cluster as an idle stop
does, with its own reason ("hours"), and the 503 it leaves names the next window's start, also as Retry-After.

It is the caretaker (caretaker.py, unchanged: the idle stop and the budget keep working inside a window, and the
budget above all) with one more check before each poll: no window is open now, and one has closed since the
caretaker was last armed. So an `up` the scheduler starts ahead of a window (or an early start asked for) is left
alone until the end of the first window after it. Runs as systemd unit kimi-caretaker instead of caretaker.py when a
schedule is set; stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kimi_cluster.node import caretaker, working_hours

RETRY_AFTER_FILE = "retry-after"  # the proxy's Retry-After while the 503 is an hours stop (_caretaker.Caddyfile.j2)


def _moment(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def hours_reason(cfg: dict[str, Any], state: dict[str, Any], now: float) -> tuple[str, datetime | None] | None:
    """(why, the next window's start) when a window has closed since the arming and none is open now; else None."""
    schedule = cfg.get("schedule")
    if not schedule or state.get("action") or state.get("awaiting_arm"):
        return None
    at = _moment(now)
    if working_hours.open_now(schedule, at) is not None:
        return None
    closed = working_hours.last_close(schedule, at)
    if closed is None or closed.timestamp() <= float(state.get("armed_at") or now):
        return None
    following = working_hours.next_opening(schedule, at)
    why = f"the working window closed at {closed:%a %H:%M %Z} (kimi-cluster:schedule)"
    return why, following.start if following else None


def begin_hours_stop(cfg: dict[str, Any], state: dict[str, Any], why: str, opens: datetime | None,
                     now: float) -> None:
    """The caretaker's own stop, with the hours' 503: the Retry-After goes first, so the 503 never lacks it."""
    flags = Path(cfg["flag_dir"])
    if opens is not None:
        # No newline: Caddy's {file.*} gives the file's bytes as they are, and a header value holds no newline.
        tmp = flags / f".{RETRY_AFTER_FILE}.{os.getpid()}.tmp"
        tmp.write_text(working_hours.http_date(opens))
        os.replace(tmp, flags / RETRY_AFTER_FILE)
    when = (f"the next window opens at {opens:%a %Y-%m-%d %H:%M %Z} ({working_hours.http_date(opens)})"
            if opens else "no window is scheduled")
    body = {"error": {"message": f"this cluster is outside its working hours: {why}; its GPU VMs are deleted, {when}"
                                 ", and it serves again from then", "type": "cluster_stopped", "code": 503,
                      "reason": "hours", "stopped_at": caretaker.stamp(now),
                      "next_window": opens.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if opens else None}}
    caretaker.write_json(flags / caretaker.STOPPED_FILE, body)
    state["action"] = {"reason": "hours", "why": why, "started_at": caretaker.stamp(now), "started": now,
                       "deleted": [], "done_at": None,
                       "spend_usd_at_stop": round(float(state.get("spend_usd") or 0), 4),
                       "errors": [], "next_window": body["error"]["next_window"]}
    state.pop("warning", None)
    (flags / caretaker.WARNING_FILE).unlink(missing_ok=True)
    caretaker.log(f"STOPPING: {why}; deleting the GPU VMs {', '.join(cfg['gpu_vms'][::-1])} (the 503 is up, "
                  f"{when})")


def tick(cfg: dict[str, Any], api: Any, state: dict[str, Any], save: Any) -> None:
    now = time.time()
    due = hours_reason(cfg, state, now)
    if due:
        begin_hours_stop(cfg, state, *due, now)
        save()
    caretaker.tick(cfg, api, state, save)
    action = state.get("action")
    if not (action and action.get("reason") == "hours"):
        (Path(cfg["flag_dir"]) / RETRY_AFTER_FILE).unlink(missing_ok=True)


Tick = Callable[[dict[str, Any], Any, dict[str, Any], Callable[[], None]], None]


def run(argv: list[str] | None, doc: str, poll: Tick, banner: Callable[[dict[str, Any]], str]) -> int:
    """The caretaker's loop with `poll` in place of caretaker.py's tick: its configuration and key read, its state
    loaded, `banner` logged, then one poll every poll_seconds, the state saved by each (caretaker.py's own main is
    left as it is: a stack without a schedule runs that one)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--config", required=True, help="the caretaker's configuration (JSON, no secret)")
    parser.add_argument("--once", action="store_true", help="one poll, then exit (tests)")
    args = parser.parse_args(argv)
    cfg = json.loads(Path(args.config).read_text())
    key = Path(cfg["key_file"]).read_text().strip()
    if not key:
        caretaker.log(f"no API key in {cfg['key_file']}; the caretaker step writes it from its stdin")
        return 1
    api = caretaker.Api(cfg["api_url"], key, float(cfg.get("retry_base_seconds", 1.0)))
    path = Path(cfg["state_file"])
    state = caretaker.load_state(path)
    caretaker.log(banner(cfg))
    while True:
        poll(cfg, api, state, lambda: caretaker.write_json(path, state))
        if args.once:
            return 0
        time.sleep(cfg["poll_seconds"])


def main(argv: list[str] | None = None) -> int:
    return run(argv, __doc__, tick, lambda cfg: f"caretaker for {cfg['env_name']} with working hours in "
               f"{cfg['schedule']['time_zone']}: {len(cfg['schedule']['windows'])} window(s) a week")


if __name__ == "__main__":
    sys.exit(main())
