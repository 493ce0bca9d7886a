"""Working hours (kimi-cluster:schedule) in the offline plan: the windows, what a week costs with them against running
all week, and the break-even against the API per scheduled hour.

A week with the schedule bills each window's replicas for its hours, plus one bring-up ahead of each opening (the
scheduler starts `up` that far ahead: the GPU VMs bill from their creation), plus the front all week (it stays).
The break-even is the week's bill spread over the scheduled hours, against the API's price for the same tokens
(kimi_cluster/blueprint/pricing.py), so a team sees the output rate its working hours must sustain.
"""

from __future__ import annotations

from typing import Any

from kimi_cluster.blueprint.caretaker import gpu_usd_per_hour, schedule_of
from kimi_cluster.blueprint.pricing import break_even
from kimi_cluster.node.working_hours import DAYS, weekly_hours
from kimi_cluster.settings import Settings

WEEK_HOURS = 7 * 24


def _days(days: list[int]) -> str:
    if len(days) > 2 and days == list(range(days[0], days[-1] + 1)):
        return f"{DAYS[days[0]]}-{DAYS[days[-1]]}"
    return ",".join(DAYS[d] for d in days)


def openings_a_week(schedule: dict[str, Any]) -> int:
    """How many times a week a window opens after a closed spell (two windows that meet are one opening)."""
    starts = {d * 1440 + _minutes(w["start"]) for w in schedule["windows"] for d in w["days"]}
    ends = {(d * 1440 + _minutes(w["end"])) % (7 * 1440) for w in schedule["windows"] for d in w["days"]}
    return len(starts - ends)


def _minutes(text: str) -> int:
    hours, minutes = text.split(":")
    return int(hours) * 60 + int(minutes)


def modelled_bringup_minutes(settings: Settings) -> float:
    """A later bring-up's modelled time, its high end (kimi_cluster/operator/bringup.py): the scheduler's lead before
    the stack has a bring-up of its own measured."""
    from kimi_cluster.operator import bringup

    return bringup.total_s(bringup.phases(settings, sharded=True, kernel_cache=settings.kernel_cache is not None,
                                          warmup_beside=settings.kernel_warmup))[1] / 60


def hours(settings: Settings) -> dict[str, Any] | None:
    """The plan's data for the schedule (None without one)."""
    schedule = schedule_of(settings)
    if schedule is None:
        return None
    bringup_minutes = round(modelled_bringup_minutes(settings), 1)
    per_replica = gpu_usd_per_hour(settings) / settings.replicas
    front = settings.front_usd_per_hour if settings.has_front else 0.0
    spans = weekly_hours(schedule)
    scheduled = sum(h for h, _ in spans)
    out: dict[str, Any] = {
        "time_zone": schedule["time_zone"],
        "windows": [{"days": _days(w["days"]), "start": w["start"], "end": w["end"], "replicas": w["replicas"],
                     "hours_a_week": h} for w, (h, _) in zip(schedule["windows"], spans, strict=True)],
        "scheduled_hours_a_week": scheduled, "openings_a_week": openings_a_week(schedule),
        "bringup_minutes_ahead": bringup_minutes,
    }
    if not per_replica or front is None:
        return out | {"week_usd": None}
    lead_hours = (bringup_minutes or 0) / 60 * out["openings_a_week"]
    widest = max(w["replicas"] for w in schedule["windows"])
    gpu_week = sum(h * r * per_replica for h, r in spans) + lead_hours * widest * per_replica
    week = round(gpu_week + front * WEEK_HOURS, 2)
    all_week = round((per_replica * settings.replicas + front) * WEEK_HOURS, 2)
    out |= {"week_usd": week, "all_week_usd": all_week, "saved_usd": round(all_week - week, 2),
            "bringup_usd": round(lead_hours * widest * per_replica, 2)}
    point = break_even(round(week / scheduled, 2), settings.api_price, settings.token_mix) if scheduled else None
    if point is not None:
        out["break_even_per_scheduled_hour"] = {
            "cluster_usd_per_scheduled_hour": point.cluster_usd_per_hour,
            "output_tokens_per_hour": round(point.output_tokens_per_hour),
            "output_tokens_per_second": round(point.output_tokens_per_second, 2)}
    return out


def format_hours(h: dict[str, Any] | None) -> list[str]:
    if h is None:
        return []  # no schedule: the plan says what it said
    lines = [f"Hours        {h['scheduled_hours_a_week']:g} of {WEEK_HOURS} hours a week, in {h['time_zone']}; "
             "outside them the caretaker deletes the GPU VMs, `kimi-cluster schedule` brings them back"]
    for w in h["windows"]:
        lines.append(f"             {w['days']} {w['start']}-{w['end']}: {w['replicas']} replica"
                     f"{'s' if w['replicas'] != 1 else ''} ({w['hours_a_week']:g} h a week)")
    if h.get("week_usd") is None:
        lines.append("             a week's cost unknown (no price for the GPUs or the front)")
        return lines
    ahead = h["bringup_minutes_ahead"]
    lines.append(f"             a week: ${h['week_usd']:,.2f} with the schedule against ${h['all_week_usd']:,.2f} "
                 f"all week (${h['saved_usd']:,.2f} less), {h['openings_a_week']} bring-up(s) of "
                 f"{ahead:.0f} min (modelled) ahead of the windows included (${h['bringup_usd']:,.2f})")
    be = h.get("break_even_per_scheduled_hour")
    if be:
        lines.append(f"             break-even per scheduled hour: ${be['cluster_usd_per_scheduled_hour']:,.2f}, "
                     f"{be['output_tokens_per_hour']:,} output tokens an hour ({be['output_tokens_per_second']:,.1f}/s)"
                     " sustained in the windows; below it the API is cheaper")
    return lines
