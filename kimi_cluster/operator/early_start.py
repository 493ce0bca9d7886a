"""Early starts (kimi-cluster:schedule.earlyStart), the scheduler's side: the pending ask is read from the front, the
budget is checked against the caretaker's spend, and an ask is answered once, by one `up` or by a refusal.

A client with the stack's key asks outside the hours with `POST /kimi/early-start` (it gets the hours' 503 and its
Retry-After, with `Kimi-Early-Start: recorded`); the caretaker on the front records one pending ask and serves it to a
keyed `GET /kimi/early-start`, with the spend it last read (kimi_cluster/node/caretaker_early.py). The scheduler reads
it at each look while it waits for a window; the caretaker drops the ask once the GPU VMs are back, and the
scheduler's record keeps the last ask it answered, so an ask is never answered twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import requests

from kimi_cluster.checks.target import Target
from kimi_cluster.operator.scheduler import Decision, Record

ASK_PATH = "/kimi/early-start"  # kimi_cluster/node/caretaker_early.py's, and the front's (_caretaker.Caddyfile.j2)
ASK_BYTES_MAX = 4096  # the ask is a few fields; a longer answer is not the caretaker's


def read_ask(endpoint_url: str, api_key: str | None, ca_certificate: str | None,
             timeout: float = 15.0) -> dict[str, Any] | None:
    """The pending ask, or None: without one the front answers the hours' 503 (or, while the cluster serves, the
    engine's 404). A network error raises (OSError, requests' errors), for the caller to report."""
    target = Target(endpoint_url, api_key=api_key, timeout=timeout, ca_certificate=ca_certificate)
    with requests.get(target.base_url + ASK_PATH, headers={"Authorization": f"Bearer {api_key}"}, stream=True,
                      verify=target.verify, timeout=timeout) as answer:
        if answer.status_code != 200:
            return None
        body = answer.raw.read(ASK_BYTES_MAX + 1, decode_content=True)
    try:
        ask = json.loads(body) if len(body) <= ASK_BYTES_MAX else None
    except ValueError:
        return None
    return ask if isinstance(ask, dict) and isinstance(ask.get("asked_at"), str) else None


@dataclass(frozen=True)
class Answer:
    """What the scheduler does with an ask: "up" now, "refused" (said and recorded), or "none"."""

    action: str
    line: str


def answer(ask: dict[str, Any] | None, answered: dict[str, Any] | None, bringup_usd: float) -> Answer:
    """`bringup_usd`: what the GPU VMs bill until they serve (the lead's time at their rate). An up whose bring-up
    would take the spend to the budget is one the caretaker would stop before it serves: refused."""
    if ask is None:
        return Answer("none", "")
    asked = f"an early start asked at {ask['asked_at']} ({int(ask.get('asks') or 1)} ask(s))"
    if answered and answered.get("asked_at") == ask["asked_at"]:
        return Answer("none", f"{asked} was answered already ({answered.get('outcome')})")
    budget, spend = ask.get("budget_usd"), float(ask.get("spend_usd") or 0)
    if budget and spend + bringup_usd >= float(budget):
        return Answer("refused", f"{asked}: refused, the budget would stop it: ${spend:,.2f} spent of "
                                 f"${float(budget):,.2f}, and a bring-up bills about ${bringup_usd:,.2f} before it "
                                 "serves (kimi-cluster:budgetUsd)")
    within = f" (${spend:,.2f} spent of ${float(budget):,.2f})" if budget else ""
    return Answer("up", f"{asked}: starting an up now{within}")


def look(record: Record, decision: Decision, read: Callable[[], dict[str, Any] | None],
         usd_per_hour: Callable[[int], float]) -> Answer:
    """One look for an ask while the scheduler waits for `decision`'s window: the answer, recorded before the up runs
    (a scheduler killed in that up runs it again as any interrupted up, and never answers the ask twice)."""
    try:
        ask = read()
    except (OSError, ValueError, requests.RequestException) as err:
        return Answer("none", f"the pending early start could not be read from the front: {str(err)[:300]}")
    replicas = decision.opening.replicas
    outcome = answer(ask, record.data.get("early"), usd_per_hour(replicas) * decision.lead_seconds / 3600)
    if ask is not None and outcome.action in ("up", "refused"):
        record.data["early"] = {"asked_at": ask["asked_at"], "outcome": outcome.action, "line": outcome.line,
                                "answered_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                                "replicas": replicas, "at": round(time.time(), 1)}
        record.save()
    return outcome
