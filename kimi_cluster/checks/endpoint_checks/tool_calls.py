"""The tool_calls check: the model calls both local tools, reads their results and combines them."""

from __future__ import annotations

import json
import re
from typing import Any

from kimi_cluster.checks.client import Api
from kimi_cluster.checks.messages import assistant_turn
from kimi_cluster.checks.prompts import LONG_BUDGET, MAX_TOOL_TURNS, TOOL_TASK
from kimi_cluster.checks.results import CheckFailed
from kimi_cluster.checks.text import short
from kimi_cluster.checks.tools import TOOL_IMPLS, TOOLS


def _run_call(turn: int, call: Any, metrics: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """(call id, tool name, result) of one tool call the model made; a malformed call fails the check."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise CheckFailed(f"turn {turn}: tool call without a function: {short(json.dumps(call))}", metrics)
    name = function.get("name")
    if name not in TOOL_IMPLS:
        raise CheckFailed(f"turn {turn}: tool call names {name!r}, not one of {sorted(TOOL_IMPLS)}", metrics)
    raw = function.get("arguments")
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        raise CheckFailed(
            f"turn {turn}: arguments of {name} are not JSON: {short(str(raw), 120)!r} "
            "(is the server started with --tool-call-parser kimi_k3?)",
            metrics,
        ) from None
    if not isinstance(args, dict):
        raise CheckFailed(f"turn {turn}: arguments of {name} are not a JSON object: {short(str(raw), 120)!r}", metrics)
    try:
        result = TOOL_IMPLS[name](**args)
    # What the model's arguments can make a tool raise (a wrong or missing argument, an expression safe_arithmetic
    # refuses or cannot parse, a division by zero or an overflow): the model sees it, as an agent loop would show it.
    except (TypeError, ValueError, SyntaxError, ArithmeticError) as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    return call.get("id") or name, name, result


def check_tool_calls(api: Api) -> tuple[str, dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant with tools."},
        {"role": "user", "content": TOOL_TASK},
    ]
    called: list[str] = []
    metrics: dict[str, Any] = {"tool_calls": called}
    final = ""
    for turn in range(MAX_TOOL_TURNS):
        reply = api.chat(messages, effort="high", max_tokens=LONG_BUDGET, tools=TOOLS)
        calls = reply.message.get("tool_calls") or []
        if not calls:
            final = reply.content
            metrics["turns"] = turn + 1
            break
        messages.append(assistant_turn(reply.message))
        for call in calls:
            call_id, name, result = _run_call(turn, call, metrics)
            called.append(name)
            messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": json.dumps(result)})
    else:
        raise CheckFailed(f"the model still asked for tools after {MAX_TOOL_TURNS} turns", metrics)
    metrics["answer"] = short(final, 200)
    not_called = sorted(set(TOOL_IMPLS) - set(called))
    if not_called:
        raise CheckFailed(f"the model never called {', '.join(not_called)}; answer: {short(final, 120)!r}", metrics)
    problems = []
    if not re.search(r"4[,.'\s\u00a0\u202f]?183", final):
        problems.append("does not contain 4183 (47 * 89)")
    if not (re.search(r"22\s*°?\s*C", final, re.IGNORECASE) and re.search(r"\bclear\b", final, re.IGNORECASE)):
        problems.append("does not give Tokyo's weather (22C, clear)")
    if problems:
        raise CheckFailed(f"the final answer {short(final, 160)!r} " + " and ".join(problems), metrics)
    return f"{len(called)} tool calls over {metrics['turns']} turns; answer has 4183 and 22C clear", metrics
