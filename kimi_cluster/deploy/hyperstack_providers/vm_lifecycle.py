"""A VM's way through the API's states: what counts as gone, waiting for a new VM to be ACTIVE (with its floating
IP), and deleting one until GET answers 404."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from kimi_cluster.deploy.hyperstack_providers.failures import ProvisioningError, transient
from kimi_cluster.deploy.hyperstack_providers.polling import Look, poll, unanswered
from kimi_cluster.deploy.hyperstack_providers.specs import VmSpec
from kimi_cluster.hyperstack_api.api import HyperstackClient, HyperstackError
from kimi_cluster.hyperstack_api.records import VmRecord

GONE = ("DELETING", "DELETED")


def describe_vm(vm: Mapping[str, Any]) -> str:
    return (f"status={vm.get('status')} vm_state={vm.get('vm_state')} power_state={vm.get('power_state')} "
            f"floating_ip_status={vm.get('floating_ip_status')} floating_ip={vm.get('floating_ip')}")


def wait_active(api: HyperstackClient, spec: VmSpec, vm: VmRecord) -> VmRecord:
    """Poll until the VM is ACTIVE, with its floating IP when it asked for one; ERROR, or a deletion by someone
    else, fails at once."""
    vm_id = vm["id"]

    def probe() -> Look[VmRecord]:
        try:
            current = api.get_vm(vm_id)
        except HyperstackError as err:
            if transient(err):
                return unanswered(err, "ACTIVE")
            raise
        status = current.get("status")
        if status == "ERROR":
            try:
                events = api.vm_events(vm_id)
            except HyperstackError:
                events = []
            reasons = "; ".join(f"{e.get('reason')}: {e.get('message')}" for e in events
                                if e.get("type") == "error" or e.get("reason") == "ERROR") or "no event text"
            raise ProvisioningError(f"VM {spec.name!r} (id {vm_id}) went to ERROR while being created "
                                    f"({describe_vm(current)}); events: {reasons}")
        if status in GONE:
            raise ProvisioningError(f"VM {spec.name!r} (id {vm_id}) is being deleted by someone else")
        if status != "ACTIVE":
            return Look(str(status), None, "ACTIVE", describe_vm(current))
        if current.get("floating_ip") or not spec.assign_floating_ip:
            return Look("ACTIVE", current, "", describe_vm(current))
        return Look("ACTIVE without its floating IP", None, "the floating IP", describe_vm(current))

    what = f"VM {spec.name!r} (id {vm_id}) to be ACTIVE" + (
        " with its floating IP attached" if spec.assign_floating_ip else "")
    return poll(spec.name, what, spec.create_timeout_seconds, spec.poll_interval_seconds, probe)


def delete_vm_and_wait(api: HyperstackClient, vm_id: int, what: str, timeout: float, interval: float) -> None:
    """DELETE (retrying while the API says the VM is still being created), then wait for GET to answer 404."""
    deadline = time.monotonic() + timeout

    def attempt() -> Look[bool]:
        try:
            api.delete_vm(vm_id)
        except HyperstackError as err:
            if err.not_found:
                return Look("gone", True)
            # The API refuses to delete a VM that is still CREATING; 409 is what it declares for that.
            if err.status == 409 or "being created" in err.message.lower():
                return Look("deletion refused (still being created)", None, "the API to accept the deletion",
                            str(err))
            if transient(err):
                return unanswered(err, "the API to accept the deletion")
            raise
        return Look("deletion accepted", True)

    poll(what, f"{what} to accept deletion", timeout, interval, attempt)

    def gone() -> Look[bool]:
        try:
            vm = api.get_vm(vm_id)
        except HyperstackError as err:
            if err.not_found:
                return Look("gone (GET answers 404)", True)
            if transient(err):
                return unanswered(err, "GET to answer 404")
            raise
        return Look(str(vm.get("status")), None, "GET to answer 404", describe_vm(vm))

    poll(what, f"{what} to disappear after deletion (GET answering 404)",
         max(deadline - time.monotonic(), interval), interval, gone)
