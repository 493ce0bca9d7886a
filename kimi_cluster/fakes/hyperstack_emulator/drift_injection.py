"""Drift made on purpose: the emulator's VM power operations and the changes made behind Pulumi's back.

(The providers' side, how a diff sees such a change, is kimi_cluster/deploy/hyperstack_providers/drift_detection.py.)

The API's stop and start (`GET /core/virtual-machines/{id}/stop` and `.../start`, lifecycle actions as GET requests
in Hyperstack's OpenAPI): stop takes an ACTIVE or ERROR VM through STOPPING to SHUTOFF, start a SHUTOFF one through
STARTING to ACTIVE, and any other state is answered 400 bad_request. A SHUTOFF VM still bills, as on Hyperstack; its
node runs nothing (its processes end, its disk stays), and a start boots it again.

The test-only admin route `POST /_emulator/drift {"name", "action", ...}` changes a VM as someone else would, with no
stack told: `stop` (as a console user's stop), `delete-rule` (one of its firewall rules, by `port`, else the first),
`resize` (another `flavor_name` and/or `image_name` than it was created with).

The emulator reaches these through its route table (routes.py includes `ROUTES`), its admin routes (admin.py) and
lifecycle.status, which asks power.py first; a VM's stop or start in progress lives in its `power` field.
"""

from __future__ import annotations

import time
from typing import Any

from . import lifecycle
from .catalog import FLAVORS
from .power import Power
from .state import ApiError, Cloud, Vm

# The admin actions, for the route's refusal of another.
ACTIONS = ("stop", "delete-rule", "resize")


def _stop(cloud: Cloud, vm: Vm) -> None:
    status = lifecycle.status(cloud, vm)[0]
    if status not in ("ACTIVE", "ERROR"):
        raise ApiError(400, "bad_request",
                     f"Virtual machine is {status}: only an ACTIVE or ERROR one can be stopped")
    vm.power = Power("stopping", time.monotonic())
    vm.events.append(lifecycle.event(vm, "info", "STOPPING", "Virtual machine stop initiated"))
    cloud.shutdown(vm)  # a stopped machine runs nothing; its bill goes on (SHUTOFF bills)


def stop_vm(cloud: Cloud, query: Any, body: Any, vm_id: str) -> dict[str, Any]:
    _stop(cloud, cloud.get_vm(vm_id))
    return {"status": True, "message": "Virtual machine stop initiated"}


def start_vm(cloud: Cloud, query: Any, body: Any, vm_id: str) -> dict[str, Any]:
    vm = cloud.get_vm(vm_id)
    status = lifecycle.status(cloud, vm)[0]
    if status != "SHUTOFF":
        raise ApiError(400, "bad_request", f"Virtual machine is {status}: only a SHUTOFF one can be started")
    vm.power = Power("starting", time.monotonic())
    vm.events.append(lifecycle.event(vm, "info", "STARTING", "Virtual machine start initiated"))
    if cloud.nodes is not None:
        key = next(k for k in cloud.state.keypairs.values()
                   if k["name"] == vm.key_name and k["environment_id"] == vm.environment_id)
        cloud.nodes.boot(vm.fixed_ip, vm.user_data, key["public_key"], [r.fields() for r in vm.rules.values()])
    return {"status": True, "message": "Virtual machine start initiated"}


ROUTES = [
    ("GET", r"/core/virtual-machines/(\d+)/stop", stop_vm),
    ("GET", r"/core/virtual-machines/(\d+)/start", start_vm),
]


def admin(cloud: Cloud, body: Any) -> tuple[int, Any]:
    """POST /_emulator/drift: change a live VM behind the stack's back (`ACTIONS`)."""
    if not isinstance(body, dict):
        return 400, {"status": False, "message": 'drift expects {"name": VM, "action": ' + " | ".join(ACTIONS) + "}"}
    name, action = str(body.get("name") or ""), str(body.get("action") or "")
    with cloud.lock:
        vm = next((v for v in cloud.state.vms.values() if v.name == name and v.deleting_since is None), None)
        if vm is None:
            return 404, {"status": False, "message": f"no live VM named {name!r}"}
        try:
            if action == "stop":
                _stop(cloud, vm)
                return 200, {"status": True, "id": vm.id, "name": vm.name, "action": action}
            if action == "delete-rule":
                port = body.get("port")
                rule = next((r for r in vm.rules.values() if port is None or r.port_range_min == port), None)
                if rule is None:
                    return 404, {"status": False, "message": f"VM {name!r} has no rule for port {port}"}
                del vm.rules[rule.id]
                cloud.firewall(vm)
                return 200, {"status": True, "id": vm.id, "rule_id": rule.id, "action": action}
            if action == "resize":
                if body.get("flavor_name"):
                    flavor = next((f for f in FLAVORS if f["name"] == body["flavor_name"]), None)
                    if flavor is None:
                        return 404, {"status": False, "message": f"no flavor {body['flavor_name']!r}"}
                    vm.flavor = flavor
                if body.get("image_name"):
                    vm.image_name = str(body["image_name"])
                return 200, {"status": True, "id": vm.id, "action": action, "flavor_name": vm.flavor["name"],
                             "image_name": vm.image_name}
        except ApiError as err:
            return err.status, {"status": False, "message": err.message}
    return 400, {"status": False, "message": f"unknown drift action {action!r} (actions: {', '.join(ACTIONS)})"}
