"""The caretaker's guards in the offline plan: what each does, what the budget buys, and the break-even beside it.

`guards(settings, break_even)` is the plan's data (`kimi_cluster.cli.plan --json`), `format_guards` its text; the hours
are
the budget over the GPU VMs' rate (the front is not counted), and the API's side is what Moonshot's API would charge
for the tokens of the break-even throughput (kimi_cluster/plan/pricing.py), so a team can see whether the budget is the
cluster's or the API's money.
"""

from __future__ import annotations

from typing import Any

from kimi_cluster.blueprint.caretaker import gpu_usd_per_hour, home_name
from kimi_cluster.operator.hours_report import format_hours, hours
from kimi_cluster.settings import NAMESPACE, Settings


def guards(settings: Settings, break_even: dict[str, Any] | None) -> dict[str, Any]:
    timing = settings.caretaker
    out: dict[str, Any] = {
        "idle_stop_minutes": settings.idle_stop_minutes, "budget_usd": settings.budget_usd,
        "runs_on": home_name(settings) if settings.guarded else None,
        "poll_seconds": timing.poll_seconds, "minute_seconds": timing.minute_seconds,
        "gpu_usd_per_hour": gpu_usd_per_hour(settings), "hours": hours(settings),
    }
    if settings.budget_usd is not None and out["gpu_usd_per_hour"]:
        out["budget_hours"] = round(settings.budget_usd / out["gpu_usd_per_hour"], 2)
        out["warn_at_usd"] = round(0.8 * settings.budget_usd, 2)
        # The most it bills past the budget: one poll at the GPU VMs' rate (plus the deletes' own minutes).
        out["overshoot_usd"] = round(out["gpu_usd_per_hour"] * timing.poll_seconds / 3600, 2)
        if break_even is not None:
            per_m = break_even["api_usd_per_m_output_with_input"]
            out["budget_as_api_output_tokens"] = round(settings.budget_usd / per_m * 1_000_000)
            out["break_even_output_tokens_per_second"] = break_even["output_tokens_per_second"]
    return out


def format_guards(g: dict[str, Any]) -> list[str]:
    idle = g["idle_stop_minutes"]
    lines = ["Guards       " + (f"idle stop after {idle} min without an inference request (a POST) through the "
                                 "proxy (GETs such as /health, /v1/models, /metrics and 401s do not count)" if idle else
                                 f"idle stop off ({NAMESPACE}:idleStopMinutes)")]
    budget = g["budget_usd"]
    if budget is None:
        lines.append(f"             budget off ({NAMESPACE}:budgetUsd): " + (
            "outside the working hours below the bill stops" if g.get("hours") else
            "only `pulumi destroy` stops the bill"))
    elif "budget_hours" in g:
        lines.append(f"             budget ${budget:,.2f}: {g['budget_hours']:,.1f} hours of the GPU VMs at "
                     f"${g['gpu_usd_per_hour']:,.2f}/h; warns at ${g['warn_at_usd']:,.2f} (80 %), deletes them at "
                     f"100 %, at most ${g['overshoot_usd']:,.2f} (one {g['poll_seconds']:g} s poll) plus the deletes' "
                     "own minutes past it")
        if "budget_as_api_output_tokens" in g:
            lines.append(f"             the API would sell {g['budget_as_api_output_tokens']:,} output tokens (their "
                         f"input included) for ${budget:,.2f}; the cluster beats it only above "
                         f"{g['break_even_output_tokens_per_second']:,.1f} output tokens/s sustained (break-even)")
    else:
        lines.append(f"             budget ${budget:,.2f} (no price known for the GPUs: hours unknown)")
    if g["runs_on"]:
        lines.append(f"             kept by the caretaker on {g['runs_on']}, every {g['poll_seconds']:g} s, with "
                     f"{NAMESPACE}:caretakerApiKey (a key on that VM: whoever gets root there holds the account)")
    return lines + format_hours(g.get("hours"))
