"""`status`'s view of the caretaker (idleStopMinutes, budgetUsd): its idle minutes, the spend against the budget, and
what it did and when, read from its state file on the VM it runs on (kimi_cluster/plan/caretaker.py), over SSH.

The file is the node's: every field is checked for its type and bound before it reaches the report, and text from it
is made printable there (status_report.format_report).
"""

from __future__ import annotations

import json
import math
import shlex
from datetime import UTC, datetime
from typing import Any

from kimi_cluster.blueprint.caretaker import schedule_of
from kimi_cluster.operator.hours_status import format_hours_status, hours_view, last_up
from kimi_cluster.operator.node_exec import NodeRunner
from kimi_cluster.operator.stack_state import StackState
from kimi_cluster.plan.caretaker import STATE_DIR, STATE_FILE
from kimi_cluster.settings import Settings

READ_TIMEOUT_S = 30.0
STATE_MAX_BYTES = 256 * 1024


def _num(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _text(value: Any, limit: int = 300) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def _action(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    deleted = raw.get("deleted")
    return {"reason": _text(raw.get("reason"), 20), "why": _text(raw.get("why")),
            "started_at": _text(raw.get("started_at"), 40), "done_at": _text(raw.get("done_at"), 40),
            "deleted": [d[:60] for d in deleted if isinstance(d, str)][:64] if isinstance(deleted, list) else []}


def checked_state(raw: Any) -> dict[str, Any]:
    """The caretaker's state file, field by field, as the report may show it."""
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    history = raw.get("history")
    stops = [a for a in (history[-50:] if isinstance(history, list) else []) + [raw.get("action")]
             if isinstance(a, dict) and a.get("reason") == "hours"]
    return {"last_hours_stop": _action(stops[-1]) if stops else None,
            "idle_minutes": _num(raw.get("idle_minutes")), "requests": _num(raw.get("requests")),
            "spend_usd": _num(raw.get("spend_usd")), "spend_source": _text(raw.get("spend_source")),
            "served_since": _num(raw.get("served_since")), "warning": _text(raw.get("warning")),
            "action": _action(raw.get("action")),
            "last_action": _action(history[-1]) if isinstance(history, list) and history else None}


def caretaker_view(state: StackState, settings: Settings, runner: NodeRunner) -> dict[str, Any] | None:
    """None when neither guard is set; else what the caretaker knows, or why it could not be read."""
    if not settings.guarded:
        return None
    name = state.outputs.get("caretaker_vm") or (settings.front_name if settings.has_front else settings.node_name(0))
    view: dict[str, Any] = {"vm": name, "idle_stop_minutes": settings.idle_stop_minutes,
                            "budget_usd": settings.budget_usd}
    node = next((n for n in state.nodes if n.name == name), None)
    if node is None or node.connection is None:
        view["error"] = f"{name} is not in the stack's state (deleted by the caretaker? `pulumi up` brings it back)"
        view["hours"] = hours_view(schedule_of(settings), datetime.now(UTC), None, last_up(state.stack))
        return view
    path = f"var/lib/kimi-cluster/{STATE_DIR}/{STATE_FILE}"
    command = f"cd {shlex.quote(settings.node_root)} && sudo -n head -c {STATE_MAX_BYTES} {path}"
    code, out, err = runner.run(node.connection, command, "", READ_TIMEOUT_S)
    if code != 0:
        view["error"] = f"cannot read its state on {name} (exit {code}): {(err or out).strip()[-200:]}"
        return view
    try:
        view.update(checked_state(json.loads(out)))
    except (ValueError, RecursionError) as exc:
        view["error"] = f"its state on {name} is not readable: {exc}"
    view["hours"] = hours_view(schedule_of(settings), datetime.now(UTC), view.get("last_hours_stop"),
                               last_up(state.stack))
    return view


def format_caretaker(view: dict[str, Any]) -> list[str]:
    idle, budget = view.get("idle_stop_minutes"), view.get("budget_usd")
    head = f"caretaker on {view['vm']}:"
    if view.get("error"):
        return [f"{head} {view['error']}"] + format_hours_status(view.get("hours"))
    parts = []
    if idle:
        quiet = view.get("idle_minutes")
        clock = "waiting for the endpoint to serve" if not view.get("served_since") else \
            f"idle {quiet or 0:,.1f} of {idle} min"
        parts.append(f"{clock}, {int(view.get('requests') or 0):,} requests counted")
    if budget:
        spent = view.get("spend_usd") or 0.0
        parts.append(f"spent ${spent:,.2f} of ${budget:,.2f} ({100 * spent / budget:.0f} %, "
                     f"{view.get('spend_source') or 'not read yet'})")
    lines = [f"{head} {'; '.join(parts)}"]
    if view.get("warning"):
        lines.append(f"  WARNING: {view['warning']}")
    for label, act in (("STOPPED", view.get("action")), ("last stop", view.get("last_action"))):
        if act:
            done = f"done {act['done_at']}" if act.get("done_at") else "deleting"
            lines.append(f"  {label} ({act.get('reason')}) at {act.get('started_at')}, {done}: {act.get('why')}; "
                         f"deleted {', '.join(act.get('deleted') or []) or 'nothing yet'}")
    return lines + format_hours_status(view.get("hours"))
