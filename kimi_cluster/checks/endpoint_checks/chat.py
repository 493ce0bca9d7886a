"""The chat checks: an answer with separate reasoning, both effort levels, and thinking kept across turns."""

from __future__ import annotations

from typing import Any

from kimi_cluster.checks.client import Api
from kimi_cluster.checks.messages import reasoning_of
from kimi_cluster.checks.prompts import (
    BILL_PROMPT,
    LONG_BUDGET,
    PRESERVED_HISTORY,
    PRESERVED_ONLY_IN_REASONING,
    WHO_PROMPT,
)
from kimi_cluster.checks.results import CheckFailed
from kimi_cluster.checks.text import numbers_in, short


def check_chat(api: Api) -> tuple[str, dict[str, Any]]:
    reply = api.chat([{"role": "user", "content": WHO_PROMPT}], effort="low")
    content = reply.content
    field_name, reasoning = reasoning_of(reply.message)
    metrics = {
        "reasoning_field": field_name,
        "completion_tokens": reply.usage.get("completion_tokens"),
        "finish_reason": reply.finish_reason,
    }
    problems = []
    if not content:
        hint = " (finish_reason=length: the thinking used the whole budget)" if reply.finish_reason == "length" else ""
        problems.append("the answer has no content" + hint)
    if not reasoning:
        if "<think>" in content or "</think>" in content:
            problems.append(
                "the thinking arrived inline in content (saw a think tag) instead of a separate "
                "field: the server runs without --reasoning-parser kimi_k3"
            )
        else:
            problems.append(
                "the answer has no reasoning (neither reasoning_content nor reasoning is set); "
                "Kimi K3.1 Pro always thinks, so the reasoning parser is missing or broken"
            )
    if problems:
        raise CheckFailed("; ".join(problems), metrics)
    return f"answered {short(content, 80)!r} with {len(reasoning)} chars of {field_name}", metrics


def check_effort(api: Api) -> tuple[str, dict[str, Any]]:
    metrics: dict[str, Any] = {}
    for effort in ("low", "max"):
        try:
            reply = api.chat([{"role": "user", "content": BILL_PROMPT}], effort=effort, max_tokens=LONG_BUDGET)
        except CheckFailed as exc:
            raise CheckFailed(f"reasoning_effort={effort}: {exc.reason}", metrics) from exc
        if not reply.content and not reasoning_of(reply.message)[1]:
            raise CheckFailed(f"reasoning_effort={effort} answered with neither content nor reasoning", metrics)
        metrics[f"{effort}_completion_tokens"] = reply.usage.get("completion_tokens")
        metrics[f"{effort}_finish_reason"] = reply.finish_reason
    return (
        f"low and max both answer; completion tokens low={metrics['low_completion_tokens']} "
        f"max={metrics['max_completion_tokens']}",
        metrics,
    )


def check_preserved_thinking(api: Api) -> tuple[str, dict[str, Any]]:
    content = api.chat(PRESERVED_HISTORY, effort="max", max_tokens=LONG_BUDGET).content
    metrics = {"answer": short(content, 160)}
    missing = sorted(PRESERVED_ONLY_IN_REASONING - numbers_in(content))
    if missing:
        raise CheckFailed(
            f"the answer {short(content, 120)!r} does not name {' and '.join(missing)}, which only the "
            "earlier turn's reasoning_content held: the server (or its chat template) drops reasoning "
            "from the history",
            metrics,
        )
    return "named 215 and 222 from the earlier turn's reasoning", metrics
