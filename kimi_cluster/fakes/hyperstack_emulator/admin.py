"""Test-only routes under /_emulator/ (outside the API's /v1 prefix, off unless asked for, and not recorded among
the API's requests): for a test that runs the emulator in another process, such as the sandbox's."""

from __future__ import annotations

from typing import Any

from . import controls, drift_injection
from .faults import ADMIN_KINDS
from .request_log import RequestLog
from .state import Cloud
from .vms import reclaim

ADMIN_PREFIX = "/_emulator/"


def admin(cloud: Cloud, log: RequestLog, method: str, what: str, body: Any = None) -> tuple[int, Any]:
    """What exists (GET inventory), what was asked (GET requests), and POST capacity {"region", "flavor_name",
    "vms"} to change a region's stock, POST faults {"kind", ...} to arm a fault, POST reclaim {"name", "mode"} to
    take a VM away."""
    if method == "POST" and what == "capacity" and isinstance(body, dict):
        controls.set_capacity(cloud, str(body["flavor_name"]), int(body["vms"]), region=str(body["region"]))
        return 200, {"status": True}
    if method == "POST" and what == "reclaim" and isinstance(body, dict):
        return reclaim(cloud, str(body.get("name") or ""), str(body.get("mode") or "delete"))
    if method == "POST" and what == "faults" and isinstance(body, dict):
        # {"kind": "vm-error", "name": ...}: arm a fault in an emulator another process started (the sandbox's).
        fields = {k: v for k, v in body.items() if k != "kind"}
        try:
            controls.inject(cloud, ADMIN_KINDS[str(body.get("kind"))](**fields))
        except (KeyError, TypeError) as exc:
            return 400, {"status": False, "message": f"fault {body!r}: {exc} (kinds: {', '.join(ADMIN_KINDS)})"}
        return 200, {"status": True}
    if method == "POST" and what == "drift":  # a change behind the stack's back (drift_injection.py)
        return drift_injection.admin(cloud, body)
    if method == "GET" and what == "inventory":
        return 200, controls.inventory(cloud)
    if method == "GET" and what == "requests":
        return 200, [{"method": r.method, "path": r.path, "status": r.status, "authorized": r.authorized}
                     for r in log.all()]
    return 404, {"message": f"no admin route {method} {ADMIN_PREFIX}{what} (inventory, requests, capacity, "
                            "reclaim, faults, drift)"}
