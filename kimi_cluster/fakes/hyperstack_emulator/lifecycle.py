"""A VM's asynchronous life, derived from the clock so no background thread is needed: CREATING, BUILD, then ACTIVE
(its floating IP ATTACHING, then ATTACHED) or ERROR; DELETING, then gone. And the stock it leaves in a region."""

from __future__ import annotations

import time

from kimi_cluster.hyperstack_api.records import FlavorRecord, VmEventRecord

from .catalog import DEFAULT_VMS_IN_STOCK
from .power import power_status
from .state import Cloud, Vm, now_iso


def event(vm: Vm, type_: str, reason: str, message: str) -> VmEventRecord:
    return VmEventRecord(instance_id=vm.id, message=message, object="instance", org_id=1, reason=reason,
                         time=now_iso(), type=type_, user_id=1)


def status(cloud: Cloud, vm: Vm) -> tuple[str, str | None, str | None]:
    """(status, floating_ip_status, floating_ip) of the VM now."""
    life = cloud.lifecycle
    if vm.deleting_since is not None:
        return "DELETING", None, None
    if (powered := power_status(cloud, vm)) is not None:  # a stop or start behind its status (drift_injection.py)
        return powered
    age = time.monotonic() - vm.created
    if age < life.creating_seconds:
        return "CREATING", "ATTACHING" if vm.assign_floating_ip else None, None
    if age < life.creating_seconds + life.build_seconds or vm.fate == "stuck":
        return "BUILD", "ATTACHING" if vm.assign_floating_ip else None, None
    if vm.fate == "error":
        if not any(e["type"] == "error" for e in vm.events):
            vm.events.append(event(vm, "error", "ERROR", vm.error_reason))
        return "ERROR", None, None
    if not vm.assign_floating_ip:
        return "ACTIVE", None, None
    if age < life.creating_seconds + life.build_seconds + life.floating_ip_seconds:
        return "ACTIVE", "ATTACHING", None
    return "ACTIVE", "ATTACHED", vm.floating_ip


def sweep(cloud: Cloud) -> None:
    """Forget the VMs whose DELETING phase is over (each request sweeps first)."""
    now = time.monotonic()
    for vm in list(cloud.state.vms.values()):
        if vm.deleting_since is not None and now - vm.deleting_since >= cloud.lifecycle.deleting_seconds:
            del cloud.state.vms[vm.id]


def vms_left(cloud: Cloud, region: str, flavor: FlavorRecord) -> int:
    """Stock of one flavor in one region: none when marked out of stock, else capacity minus live VMs."""
    state = cloud.state
    key = (region, flavor["name"])
    if not state.stock.get(key, True):
        return 0
    used = sum(1 for v in state.vms.values() if v.flavor["name"] == flavor["name"]
               and state.environments[v.environment_id]["region"] == region and v.deleting_since is None)
    return max(state.capacity.get(key, DEFAULT_VMS_IN_STOCK) - used, 0)
