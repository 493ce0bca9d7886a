"""Changes behind Pulumi's back, as the providers see them: the emulator's stop and start (Hyperstack's lifecycle
actions, GET requests: STOPPING -> SHUTOFF, STARTING -> ACTIVE, any other state 400), a refresh's `read` that drops
what is gone and reports what changed, and the diff that replaces a stopped, resized or re-imaged VM and makes a
deleted rule again."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from kimi_cluster.deploy.hyperstack_providers import drift_detection, providers
from kimi_cluster.fakes.hyperstack_emulator.emulator import DEFAULT_API_KEY
from kimi_cluster.hyperstack_api.api import HyperstackClient, HyperstackError
from tests.hyperstack.conftest import FLAVOR, IMAGE, rule_props, vm_props

pytestmark = pytest.mark.timeout(20)


def _api(emu) -> HyperstackClient:
    return HyperstackClient(emu.base_url, DEFAULT_API_KEY, retry_base_seconds=0.005)


def _status(emu, vm_id: str, want: str) -> Any:
    deadline = time.monotonic() + 3
    while (vm := _api(emu).get_vm(int(vm_id)))["status"] != want:
        assert time.monotonic() < deadline, f"{vm['status']}, never {want}"
        time.sleep(0.01)
    return vm


@pytest.fixture
def vm(base):
    made = providers.VirtualMachineProvider().create(vm_props())
    drift_detection._seen.clear()
    return made


def test_stop_and_start_follow_the_apis_states_and_a_stopped_vm_still_bills(base, vm):
    api = _api(base)
    with pytest.raises(HyperstackError) as refused:
        api.request("GET", f"/core/virtual-machines/{vm.id}/start")
    assert refused.value.status == 400 and "ACTIVE" in str(refused.value)
    api.request("GET", f"/core/virtual-machines/{vm.id}/stop")
    assert api.get_vm(int(vm.id))["status"] in ("STOPPING", "SHUTOFF")
    stopped = _status(base, vm.id, "SHUTOFF")
    assert stopped["power_state"] == "SHUTDOWN" and stopped["floating_ip"] == vm.outs["public_ip"]
    assert base.state.billed[int(vm.id)].ended is None  # SHUTOFF bills
    with pytest.raises(HyperstackError):
        api.request("GET", f"/core/virtual-machines/{vm.id}/stop")
    api.request("GET", f"/core/virtual-machines/{vm.id}/start")
    assert _status(base, vm.id, "ACTIVE")["power_state"] == "RUNNING"


def test_a_refresh_reports_a_stopped_vm_and_the_next_up_replaces_it(base, vm):
    vm_p = providers.VirtualMachineProvider()
    assert vm_p.diff(vm.id, vm.outs, vm_props()).changes is False
    _api(base).request("GET", f"/core/virtual-machines/{vm.id}/stop")
    _status(base, vm.id, "SHUTOFF")
    read = vm_p.read(vm.id, vm.outs)
    assert read.id == vm.id and read.outs["status"] == "SHUTOFF"  # kept, and shown as it is
    diff = vm_p.diff(vm.id, read.outs, vm_props())
    assert diff.changes is True and diff.replaces == ["name"] and diff.delete_before_replace is True


@pytest.mark.parametrize(("key", "live"), [("flavor_name", "n3-H100x8"),
                                           ("image_name", "Ubuntu Server 22.04 LTS R570 CUDA 12.8 with Docker")])
def test_a_resized_or_reimaged_vm_is_drift_replaced_never_adopted(base, vm, key: str, live: str):
    base.admin = True
    change = {"name": "kimi-node-0", "action": "resize", key: live}
    assert base.handle("POST", "/_emulator/drift", {}, json.dumps(change).encode())[0] == 200
    vm_p = providers.VirtualMachineProvider()
    # Without a refresh: the diff asks the API and names the drifted input.
    diff = vm_p.diff(vm.id, vm.outs, vm_props())
    assert diff.replaces == [key] and diff.delete_before_replace is True
    # With one: the read shows the live value in the outputs (the inputs stay the stack's), and the diff replaces.
    read = vm_p.read(vm.id, vm.outs)
    assert read.outs[key] == live and read.inputs is None
    assert vm_p.diff(vm.id, read.outs, vm_props()).replaces == [key]
    assert (FLAVOR, IMAGE) != (read.outs["flavor_name"], read.outs["image_name"])


def test_a_rule_deleted_behind_the_stacks_back_is_dropped_by_a_refresh_and_made_again_by_up(base, vm):
    rule_p = providers.SecurityRuleProvider()
    rule = rule_p.create(rule_props(vm.id))
    assert rule_p.diff(rule.id, rule.outs, rule_props(vm.id)).changes is False
    _api(base).delete_vm_security_rule(int(vm.id), int(rule.id))
    drift_detection._seen.clear()  # another process deleted it: this one's cache did not see that
    assert rule_p.read(rule.id, rule.outs).id == ""
    diff = rule_p.diff(rule.id, rule.outs, rule_props(vm.id))
    assert diff.changes is True and diff.replaces == ["vm_id"] and diff.delete_before_replace is False
    again = rule_p.create(rule_props(vm.id))
    assert again.id != rule.id
    rule_p.delete(rule.id, rule.outs)  # the old one's delete finds nothing: no error
    assert rule_p.diff(again.id, again.outs, rule_props(vm.id)).changes is False


def test_the_rules_of_one_vm_cost_one_read_per_diff_pass(base, vm):
    rule_p = providers.SecurityRuleProvider()
    rules = [rule_p.create(rule_props(vm.id, port_range_min=p, port_range_max=p)) for p in (22, 80, 443)]
    base.clear_requests()
    providers.VirtualMachineProvider().diff(vm.id, vm.outs, vm_props())
    for r in rules:
        assert rule_p.diff(r.id, r.outs, rule_props(vm.id, port_range_min=r.outs["port_range_min"],
                                                    port_range_max=r.outs["port_range_max"])).changes is False
    assert [r.path for r in base.requests] == [f"/core/virtual-machines/{vm.id}"]


def test_without_a_key_the_diff_goes_by_the_inputs_alone(vm, monkeypatch):
    monkeypatch.delenv("HYPERSTACK_API_KEY")
    providers._HOST_CONFIG.clear()
    assert providers.VirtualMachineProvider().diff(vm.id, vm.outs, vm_props()).changes is False
    assert providers.SecurityRuleProvider().diff("5", rule_props(vm.id), rule_props(vm.id)).changes is False
