"""The caretaker (idleStopMinutes, budgetUsd): what it is told, and the remote step that starts it.

It runs where the endpoint is: on the front when replicas >= 2, else on replica 0's head, as systemd unit
kimi-caretaker (kimi_cluster/node/caretaker.py, shipped with kimi_cluster/node/caretaker_spend.py as weights.sh.j2 ships
the
download). Its step runs once the endpoint's readiness wait passed (the proxy's Caddyfile logs the requests it counts
and answers its 503, kimi_cluster/plan/templates/_caretaker.Caddyfile.j2); the step's text names every GPU VM's id, so
it runs again
(and arms the caretaker afresh) whenever an `up` re-creates one. Its Hyperstack key arrives on the step's stdin only.
"""

from __future__ import annotations

import json

from kimi_cluster.settings import Settings, sizing

UNIT = "kimi-caretaker"
STATE_DIR = "caretaker"  # under the node's /var/lib/kimi-cluster: config.json, state.json
STATE_FILE = "state.json"
KEY_FILE = "caretaker_api_key"  # under /etc/kimi-cluster, root only
RESTART_SECONDS = 5  # systemd's RestartSec: a killed caretaker is back within this


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
    }


def config_json(settings: Settings) -> str:
    return json.dumps(config(settings), sort_keys=True)


def guard_outputs(settings: Settings) -> dict[str, object]:
    """The stack outputs other teams read the guards from; none while both are off (today's outputs unchanged)."""
    if not settings.guarded:
        return {}
    return {"idle_stop_minutes": settings.idle_stop_minutes, "budget_usd": settings.budget_usd,
            "caretaker_vm": home_name(settings)}
