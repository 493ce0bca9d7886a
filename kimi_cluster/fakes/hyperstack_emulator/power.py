"""A VM's stop or start in progress, and the state it gives the VM meanwhile (lifecycle.status asks here first).

The API's stop and start take an ACTIVE or ERROR VM through STOPPING to SHUTOFF, and a SHUTOFF one through STARTING
to ACTIVE (drift_injection.py holds the routes); a SHUTOFF VM still bills, as on Hyperstack. The transitions take the
emulator's deleting and build times.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .state import Cloud, Vm


@dataclass
class Power:
    """A stop or start of one VM: `state` is "stopping", "shutoff" or "starting", from `since` (monotonic)."""

    state: str
    since: float


def power_status(cloud: Cloud, vm: Vm) -> tuple[str, str | None, str | None] | None:
    """(status, floating_ip_status, floating_ip) while a stop or start shapes the VM's state, else None."""
    power = vm.power
    if power is None or vm.deleting_since is not None:
        return None
    age = time.monotonic() - power.since
    ip = vm.floating_ip if vm.assign_floating_ip else None
    attached = "ATTACHED" if ip else None
    if power.state == "stopping":
        if age < cloud.lifecycle.deleting_seconds:
            return "STOPPING", attached, ip
        vm.power = Power("shutoff", power.since + cloud.lifecycle.deleting_seconds)
        return "SHUTOFF", attached, ip
    if power.state == "shutoff":
        return "SHUTOFF", attached, ip
    if age < cloud.lifecycle.build_seconds:
        return "STARTING", attached, ip
    vm.power = None  # started: ACTIVE again, as after its create
    vm.fate = "active"
    return None
