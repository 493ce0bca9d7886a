"""What a test changes or reads directly, outside the API: faults, stock, prices, and everything that exists."""

from __future__ import annotations

from typing import Any

from .faults import Fault, OutOfStock, RevokeKey
from .lifecycle import status, sweep
from .state import Cloud


def inject(cloud: Cloud, *faults: Fault) -> None:
    """Arm each fault: OutOfStock and RevokeKey change the account at once; the others wait in the fault book until
    a request takes them."""
    with cloud.lock:
        for fault in faults:
            if isinstance(fault, OutOfStock):
                cloud.state.stock[(fault.region, fault.flavor_name)] = False
            elif isinstance(fault, RevokeKey):
                cloud.api_keys.discard(fault.key)
            else:
                cloud.faults.arm(fault)


def set_capacity(cloud: Cloud, flavor_name: str, vms: int, region: str = "CANADA-1") -> None:
    """How many VMs of this flavor the region can hold in all; the stocks endpoint shows what is left."""
    with cloud.lock:
        cloud.state.capacity[(region, flavor_name)] = vms


def inventory(cloud: Cloud) -> dict[str, list[dict[str, Any]]]:
    """Everything that exists right now (a VM still DELETING exists: it may still bill)."""
    with cloud.lock:
        sweep(cloud)
        envs = cloud.state.environments
        vms = cloud.state.vms.values()
        return {
            "environments": [{"id": e["id"], "name": e["name"], "region": e["region"]} for e in envs.values()],
            "keypairs": [{"id": k["id"], "name": k["name"], "environment": envs[k["environment_id"]]["name"]}
                         for k in cloud.state.keypairs.values()],
            "virtual_machines": [{"id": v.id, "name": v.name, "status": status(cloud, v)[0],
                                  "environment": envs[v.environment_id]["name"], "labels": list(v.labels)}
                                 for v in vms],
            "security_rules": [{"vm_id": v.id, **r.fields()} for v in vms for r in v.rules.values()],
        }
