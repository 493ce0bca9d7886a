"""`kimi-cluster sandbox reclaim NODE`: the cloud takes a VM away, as a hardware fault or a maintenance reclaim
would.

The emulator deletes the VM (or leaves it in ERROR) without anyone asking its API, and ends that fake node's
namespace with everything that ran in it. Nothing else is told: the stack still holds the VM, as a real stack's does
until `pulumi refresh`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from kimi_cluster.fakes.hyperstack_emulator.admin import ADMIN_PREFIX
from kimi_cluster.operator.stack_state import checked_outputs

# How the VM goes: deleted, left in ERROR (the emulator, as the cloud's API shows it), still ACTIVE and silent, or
# stopped (SHUTOFF, as a stop in the console or through the API leaves it: it still bills, and runs nothing).
MODES = ("delete", "error", "unreachable", "stop")
# What the cloud did, as `reclaim` says it.
DONE = {"delete": "deletes", "error": "shows in ERROR", "stop": "stops (SHUTOFF, still billing)"}


def node_addresses(outputs: dict[str, Any]) -> dict[str, str]:
    """VM name -> its address, for every GPU node and the front, from the stack outputs (StackStateError naming an
    output of the wrong shape)."""
    outputs = checked_outputs(outputs)
    names = list(outputs.get("node_names") or [])
    found = dict(zip(names, outputs.get("node_public_ips") or [], strict=False))
    if outputs.get("front_public_ip"):
        found[str(outputs.get("environment_name")) + "-front"] = str(outputs["front_public_ip"])
    return {str(k): str(v) for k, v in found.items()}


def ask_emulator(api_url: str, name: str, mode: str) -> dict[str, Any]:
    """POST the emulator's admin route `reclaim` (`drift` for a stop: kimi_cluster/fakes/hyperstack_emulator/
    drift_injection.py); it must run with --admin, as the sandbox starts it."""
    base = api_url.rstrip("/").removesuffix("/v1")
    route, body = ("drift", {"name": name, "action": "stop"}) if mode == "stop" else \
        ("reclaim", {"name": name, "mode": mode})
    request = urllib.request.Request(f"{base}{ADMIN_PREFIX}{route}", method="POST", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return dict(json.load(answer))
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:300]
        raise RuntimeError(f"the emulator refused the reclaim of {name} (HTTP {err.code}: {detail}); an emulator "
                           "started by hand needs --admin") from None
