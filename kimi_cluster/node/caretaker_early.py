#!/usr/bin/env python3
"""The caretaker with working hours and early starts (kimi-cluster:schedule with earlyStart): outside the hours a
client holding the stack's key may ask for the cluster early, and this records the ask for the scheduler.

The ask is a keyed `POST /kimi/early-start` to the front while it answers the hours' 503: the front answers it with
that 503 and its Retry-After like any request (never held open), plus `Kimi-Early-Start: recorded`, and logs it in
the access log the caretaker already reads (only keyed requests are logged, _caretaker.Caddyfile.j2). Here, before
each poll of caretaker_hours.py (unchanged), the lines the poll is about to count are looked at for such an ask: the
first one makes `early-start.json` in the proxy's caretaker folder (once the stop's deletes are done), which the
front serves to a keyed `GET /kimi/early-start` (kimi_cluster/operator/early_start.py, the scheduler's side, reads
it there). One file, one pending ask: more asks only count up to ASKS_MAX, so no client grows memory or disk. The
file goes when the GPU VMs are back (whoever ran the up) or the stop is no longer the hours'. Runs as systemd unit
kimi-caretaker instead of caretaker_hours.py when earlyStart is set; stdlib only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kimi_cluster.node import caretaker, caretaker_hours

ASK_FILE = "early-start.json"  # the front serves it to a keyed GET /kimi/early-start (_caretaker.Caddyfile.j2)
ASK_PATH = "/kimi/early-start"
ASKS_MAX = 1000  # the count of asks a pending one shows, at most: a number, never a list


def asks_in(lines: bytes) -> int:
    """The asks among complete access-log lines: keyed POSTs to ASK_PATH answered by the hours' 503."""
    count = 0
    for line in lines.splitlines():
        try:
            entry = json.loads(line)
            request = entry["request"]
            asked = (request["method"] == "POST" and str(request["uri"]).split("?")[0] == ASK_PATH
                     and int(entry.get("status") or 0) == 503)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        count += asked
    return count


def peek_asks(access_log: Path, mark: dict[str, Any]) -> int:
    """The asks in what the caretaker's next poll will read of the current log (caretaker.new_requests moves the
    mark, not this). An ask in the tail of a file that has just rolled is not seen; the client's next ask is."""
    try:
        with open(access_log, "rb") as current:
            st = os.fstat(current.fileno())
            offset = int(mark.get("offset") or 0)
            if mark.get("inode") not in (None, st.st_ino) or st.st_size < offset:
                offset = 0
            current.seek(offset)
            chunk = current.read(caretaker.LOG_READ_MAX)
    except FileNotFoundError:
        return 0
    return asks_in(chunk[:chunk.rfind(b"\n") + 1])


def record_asks(cfg: dict[str, Any], state: dict[str, Any], asked: int, now: float) -> None:
    """One pending ask while the hours' stop lasts, in the state and in the file the front serves; gone after it."""
    flags = Path(cfg["flag_dir"])
    action = state.get("action")
    if not (action and action.get("reason") == "hours"):
        if state.pop("early_ask", None) is not None:
            caretaker.log("the early start asked for is settled: the GPU VMs are back, or the stop is not the hours'")
        (flags / ASK_FILE).unlink(missing_ok=True)
        return
    ask = state.get("early_ask")
    if asked and ask is None:
        ask = state["early_ask"] = {"asked_at": caretaker.stamp(now), "asks": 0}
        caretaker.log("an early start was asked for (a keyed POST /kimi/early-start): recorded for the scheduler")
    if ask is None:
        return
    ask["asks"] = min(ASKS_MAX, int(ask["asks"]) + asked)
    if not action.get("done_at"):
        return  # kept, and shown once every GPU VM is deleted: an up beside the stop's deletes would race them
    # The spend as the caretaker last read it, so that the scheduler never starts an up the budget would stop.
    caretaker.write_json(flags / ASK_FILE, {**ask, "spend_usd": round(float(state.get("spend_usd") or 0), 4),
                                            "budget_usd": cfg.get("budget_usd"),
                                            "next_window": action.get("next_window"),
                                            "updated_at": caretaker.stamp(now)})


def tick(cfg: dict[str, Any], api: Any, state: dict[str, Any], save: Any) -> None:
    asked = peek_asks(Path(cfg["flag_dir"]) / "access.log", state.setdefault("log", {}))
    caretaker_hours.tick(cfg, api, state, save)
    record_asks(cfg, state, asked, time.time())
    save()


def main(argv: list[str] | None = None) -> int:
    """caretaker_hours.py's loop, with this poll."""
    return caretaker_hours.run(argv, __doc__, tick, lambda cfg: f"caretaker for {cfg['env_name']} with working "
                               f"hours in {cfg['schedule']['time_zone']} and early starts asked by {ASK_PATH}")


if __name__ == "__main__":
    sys.exit(main())
