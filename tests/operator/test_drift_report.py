"""What `kimi-cluster plan` says of a deployed stack's VMs that changed behind Pulumi's back: a SHUTOFF VM with what it
still bills, a VM that is gone, in ERROR or of another flavor; nothing for a VM as the stack made it."""

from __future__ import annotations

import json
import time

import pytest

from kimi_cluster.fakes.hyperstack_emulator.emulator import DEFAULT_API_KEY, Emulator
from kimi_cluster.fakes.hyperstack_emulator.state import Lifecycle
from kimi_cluster.hyperstack_api.api import HyperstackClient
from kimi_cluster.operator.drift_report import drift_lines
from kimi_cluster.operator.stack_state import NodeRecord
from kimi_cluster.settings.loader import load_settings

pytestmark = pytest.mark.timeout(20)
FAST = Lifecycle(creating_seconds=0.01, build_seconds=0.01, floating_ip_seconds=0.01, deleting_seconds=0.01)


def _settings():
    return load_settings({"operatorCidr": "203.0.113.7/32", "sshPublicKey": "ssh-ed25519 AAAAC3Nza test"}, "dev")


def _until(predicate) -> None:
    deadline = time.monotonic() + 5
    while not predicate():
        assert time.monotonic() < deadline, "the emulator never got there"
        time.sleep(0.01)


def test_each_drifted_vm_is_named_with_what_up_does_and_what_a_stopped_one_still_bills():
    settings = _settings()
    with Emulator(lifecycle=FAST, admin=True) as emu:
        api = HyperstackClient(emu.base_url, DEFAULT_API_KEY, retry_base_seconds=0.005)
        api.create_environment("e", "CANADA-1")
        api.import_keypair("k", "e", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGtpbWktY2x1c3Rlci10ZXN0LWtleS1ub3QtcmVhbCEh")
        vms = [api.create_vm(name=f"n{i}", environment_name="e", flavor_name=settings.flavor_name,
                             image_name=settings.vm_image, key_name="k", labels=[], user_data=None,
                             assign_floating_ip=False) for i in range(4)]
        nodes = [NodeRecord(i, vm["name"], str(vm["id"]), None, None, None) for i, vm in enumerate(vms)]
        _until(lambda: {v["status"] for v in emu.inventory()["virtual_machines"]} == {"ACTIVE"})
        for body in ({"name": "n1", "action": "stop"}, {"name": "n2", "action": "resize", "flavor_name": "n3-H100x8"}):
            assert emu.handle("POST", "/_emulator/drift", {}, json.dumps(body).encode())[0] == 200
        emu.reclaim("n3")
        _until(lambda: [v["status"] for v in emu.inventory()["virtual_machines"]] == ["ACTIVE", "SHUTOFF", "ACTIVE"])
        found = drift_lines(api, nodes, settings, 20.8)
    assert not any(x.startswith("VM n0 ") for x in found)
    assert any("n1 is SHUTOFF" in x and "STILL BILLS $20.80/h" in x and "replaces it" in x for x in found), found
    assert any("n2 has flavor 'n3-H100x8'" in x and "never adopted" in x for x in found), found
    assert any("n3 is gone" in x and "makes it again" in x for x in found), found
