"""The caretaker (idleStopMinutes, budgetUsd) as the settings decide it: what it is told (its configuration), where
it runs, which VMs it may delete, and the stack outputs that name its guards. Its step's inputs and builder are
kimi_cluster/plan/caretaker.py; its node side kimi_cluster/node/caretaker*.py.
"""

from __future__ import annotations

import json
from typing import Any

from kimi_cluster.plan.caretaker import CaretakerInputs
from kimi_cluster.settings import Settings, schedule_rules, sizing


def gpu_vm_names(settings: Settings) -> list[str]:
    """Every GPU VM of the stack, replica after replica, each head first (the order the caretaker deletes in is the
    reverse: the last replica's workers first, replica 0's head last)."""
    return [settings.replica_node_name(r, n) for r in range(settings.replicas) for n in range(settings.nodes)]


def home_name(settings: Settings) -> str:
    """The VM the caretaker runs on: the front, or replica 0's head (which it then deletes last of all)."""
    return settings.front_name if settings.has_front else settings.node_name(0)


def gpu_usd_per_hour(settings: Settings) -> float:
    """The GPU VMs' rate (the budget counts these, not the front): what the caretaker counts on with while the
    billing history does not answer."""
    one = sizing.hourly_cost_usd(settings.price, settings.total_gpus)
    return round((one or 0.0) * settings.replicas, 4)


def config(settings: Settings) -> dict[str, object]:
    """The caretaker's configuration (no secret, no node path: the step adds those)."""
    timing = settings.caretaker
    idle = settings.idle_stop_minutes
    return {
        "env_name": settings.env_name,
        "api_url": settings.caretaker_api_url,
        "gpu_vms": gpu_vm_names(settings),
        "self_name": home_name(settings),
        "idle_seconds": idle * timing.minute_seconds if idle is not None else None,
        "budget_usd": settings.budget_usd,
        "usd_per_hour": gpu_usd_per_hour(settings),
        "poll_seconds": timing.poll_seconds,
        "minute_seconds": timing.minute_seconds,
        "health_url": f"https://127.0.0.1:{settings.api_port}/health",
    } | ({"schedule": schedule_of(settings)} if settings.schedule is not None else {})


def schedule_of(settings: Settings) -> dict[str, Any] | None:
    """The working hours' compiled form (kimi_cluster/node/working_hours.py), each window's replicas filled in."""
    if settings.schedule is None:
        return None
    return schedule_rules.with_stack(settings.schedule, settings.replicas, settings.caretaker.minute_seconds)


def caretaker_inputs(settings: Settings) -> CaretakerInputs:
    return CaretakerInputs(json.dumps(config(settings), sort_keys=True), settings.idle_stop_minutes,
                           settings.budget_usd, settings.schedule is not None,
                           bool((settings.schedule or {}).get("early_start")))


def guard_outputs(settings: Settings) -> dict[str, object]:
    """The stack outputs other teams read the guards from; none while both are off (today's outputs unchanged)."""
    if not settings.guarded:
        return {}
    return {"idle_stop_minutes": settings.idle_stop_minutes, "budget_usd": settings.budget_usd,
            "caretaker_vm": home_name(settings)} | ({"schedule": schedule_of(settings)} if settings.schedule else {})
