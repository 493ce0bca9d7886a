"""The dynamic providers against the emulator, called the way Pulumi's provider host calls them.

Every fault case (lost or 5xx create answers, 429 storms, VMs in ERROR or stuck in BUILD, bad catalog input, revoked
or rotated keys, deletes while creating) ends as required, and the emulator then holds exactly what should exist.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pulumi
import pytest
from pulumi.dynamic import Config, ConfigureRequest
from pulumi.runtime.rpc import UNKNOWN

from kimi_cluster.deploy.hyperstack_providers import providers
from kimi_cluster.deploy.hyperstack_providers.providers import (
    EnvironmentProvider,
    KeypairProvider,
    ProvisioningError,
    SecurityRuleProvider,
    VirtualMachineProvider,
)
from kimi_cluster.fakes.hyperstack_emulator.emulator import DEFAULT_API_KEY
from kimi_cluster.fakes.hyperstack_emulator.faults import (
    LostCreateResponse,
    OutOfStock,
    RateLimit,
    RevokeKey,
    ServerError,
    StuckInBuild,
    VmError,
)
from kimi_cluster.hyperstack_api.api import HyperstackClient, HyperstackError
from tests.hyperstack.conftest import FLAVOR, IMAGE, PUBLIC_KEY, env_props, keypair_props, rule_props, vm_props

pytestmark = pytest.mark.timeout(20)

OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG90aGVyLWtleS1vdGhlci1rZXktb3RoZXIta2V5ISE="
EMPTY: dict[str, list[Any]] = {"environments": [], "keypairs": [], "virtual_machines": [], "security_rules": []}


def raw(emu, key: str = DEFAULT_API_KEY) -> HyperstackClient:
    """A client for arranging the world behind the providers' back."""
    return HyperstackClient(emu.base_url, key, retry_base_seconds=0.005)


def vm_names(emu) -> list[str]:
    return [v["name"] for v in emu.inventory()["virtual_machines"]]


def wait_gone(emu, vm_id: int) -> None:
    deadline = time.monotonic() + 3
    while any(v["id"] == vm_id for v in emu.inventory()["virtual_machines"]):
        assert time.monotonic() < deadline, "VM never went away"
        time.sleep(0.01)


def mutating_calls(emu) -> list[str]:
    return [f"{r.method} {r.path}" for r in emu.requests if r.method in ("POST", "PUT", "DELETE", "PATCH")]


# --- happy paths --------------------------------------------------------------------------------------------------

def test_full_lifecycle_of_every_resource(hs):
    env_p, key_p, vm_p, rule_p = EnvironmentProvider(), KeypairProvider(), VirtualMachineProvider(), \
        SecurityRuleProvider()

    env = env_p.create(env_props())
    assert env.outs["environment_id"] == env.id and env.outs["name"] == "kimi-env"
    assert env_p.read(env.id, env.outs).id == env.id
    assert env_p.diff(env.id, env.outs, env_props()).changes is False
    moved = env_p.diff(env.id, env.outs, env_props(region="NORWAY-1"))
    assert moved.replaces == ["region"] and moved.delete_before_replace is True
    slower = env_props(poll_interval_seconds=0.02)
    assert env_p.diff(env.id, env.outs, slower).replaces == []
    assert env_p.update(env.id, env.outs, slower).outs["poll_interval_seconds"] == 0.02

    key = key_p.create(keypair_props())
    assert key.outs["fingerprint"] and key.outs["keypair_id"] == key.id
    assert key_p.read(key.id, key.outs).outs["fingerprint"] == key.outs["fingerprint"]
    assert key_p.diff(key.id, key.outs, keypair_props(public_key=PUBLIC_KEY + "-renamed")).changes is False
    assert key_p.diff(key.id, key.outs, keypair_props(public_key=OTHER_KEY)).replaces == ["public_key"]

    vm = vm_p.create(vm_props())
    outs = vm.outs
    assert outs["vm_id"] == vm.id and outs["status"] == "ACTIVE" and outs["flavor_name"] == FLAVOR
    assert outs["public_ip"].startswith("127.") and outs["private_ip"].startswith("127.")
    read = vm_p.read(vm.id, outs)
    assert read.id == vm.id and read.outs["public_ip"] == outs["public_ip"] and read.outs["labels"] == outs["labels"]
    assert read.outs["user_data_sha256"] == outs["user_data_sha256"] and read.inputs is None
    assert vm_p.diff(vm.id, outs, vm_props()).changes is False

    relabel = vm_props(labels=["kimi-cluster", "stack-test", "role-head"])
    diff = vm_p.diff(vm.id, outs, relabel)
    assert diff.changes is True and diff.replaces == []
    updated = vm_p.update(vm.id, outs, relabel)
    assert updated.outs["labels"] == relabel["labels"] and updated.outs["vm_id"] == vm.id
    assert hs.inventory()["virtual_machines"][0]["labels"] == relabel["labels"]

    rule = rule_p.create(rule_props(vm.id))
    assert rule.outs["rule_id"] == rule.id and rule.outs["port_range_min"] == 22
    assert rule_p.read(rule.id, rule.outs).id == rule.id
    assert rule_p.diff(rule.id, rule.outs, rule_props(vm.id)).changes is False
    assert rule_p.diff(rule.id, rule.outs, rule_props(vm.id, port_range_min=22.0)).changes is False  # state floats

    inventory = hs.inventory()
    assert [len(inventory[k]) for k in ("environments", "keypairs", "virtual_machines", "security_rules")] == \
        [1, 1, 1, 1]
    assert [r.path for r in hs.calls("POST", "/core/virtual-machines")] == ["/core/virtual-machines"]

    rule_p.delete(rule.id, rule.outs)
    vm_p.delete(vm.id, updated.outs)
    key_p.delete(key.id, key.outs)
    env_p.delete(env.id, env.outs)
    assert hs.inventory() == EMPTY


def test_vm_diff_replaces_for_identity_and_updates_labels_in_place(base):
    outs = VirtualMachineProvider().create(vm_props()).outs
    assert VirtualMachineProvider().diff(outs["vm_id"], outs, vm_props()).changes is False
    assert "user_data" not in outs and len(outs["user_data_sha256"]) == 64  # may hold a host key: digest only
    diff = VirtualMachineProvider().diff(outs["vm_id"], outs, vm_props(user_data="#cloud-config\nnew: 1\n"))
    assert diff.replaces == ["user_data"]
    for key, value in [("flavor_name", "n3-B300-SXM6x8"), ("image_name", "other"), ("environment_name", "e2"),
                       ("key_name", "k2"), ("name", "kimi-node-9"), ("region", "NORWAY-1")]:
        diff = VirtualMachineProvider().diff(outs["vm_id"], outs, vm_props(**{key: value}))
        assert diff.replaces == [key] and diff.delete_before_replace is True, key
    diff = VirtualMachineProvider().diff(outs["vm_id"], outs, vm_props(create_timeout_seconds=99))
    assert diff.changes is True and diff.replaces == []


def test_changing_the_operator_cidr_replaces_only_the_rule(base):
    vm = VirtualMachineProvider().create(vm_props())
    rule = SecurityRuleProvider().create(rule_props(vm.id))
    diff = SecurityRuleProvider().diff(rule.id, rule.outs, rule_props(vm.id, remote_ip_prefix="198.51.100.4/32"))
    assert diff.replaces == ["remote_ip_prefix"] and diff.delete_before_replace is False
    # Pulumi then creates the new rule and deletes the old one; the VM is not touched.
    new = SecurityRuleProvider().create(rule_props(vm.id, remote_ip_prefix="198.51.100.4/32"))
    SecurityRuleProvider().delete(rule.id, rule.outs)
    rules = base.inventory()["security_rules"]
    assert [(r["id"], r["remote_ip_prefix"]) for r in rules] == [(int(new.id), "198.51.100.4/32")]
    vm_calls = [c for c in mutating_calls(base) if c.startswith("PUT") or c == f"DELETE /core/virtual-machines/{vm.id}"]
    assert vm_calls == []
    assert len(base.calls("POST", "/core/virtual-machines")) == 1


# --- lost answers, adoption ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["500", "drop"])
def test_lost_create_answer_adopts_the_vm_and_never_makes_two(base, mode):
    base.inject(LostCreateResponse(mode=mode))
    created = VirtualMachineProvider().create(vm_props())
    assert created.outs["status"] == "ACTIVE"
    assert vm_names(base) == ["kimi-node-0"]
    assert [str(v["id"]) for v in base.inventory()["virtual_machines"]] == [created.id]
    assert len(base.calls("POST", "/core/virtual-machines")) == 1


def test_a_vm_left_by_an_interrupted_run_is_adopted_not_duplicated(base):
    p = vm_props()
    left = raw(base).create_vm(name=p["name"], environment_name="kimi-env", flavor_name=FLAVOR, image_name=IMAGE,
                               key_name="kimi-key", labels=p["labels"])
    base.clear_requests()
    created = VirtualMachineProvider().create(p)
    assert created.id == str(left["id"]) and created.outs["status"] == "ACTIVE"
    assert base.calls("POST") == [] and vm_names(base) == ["kimi-node-0"]


def test_a_same_named_vm_without_our_labels_is_neither_adopted_nor_duplicated(base):
    raw(base).create_vm(name="kimi-node-0", environment_name="kimi-env", flavor_name=FLAVOR, image_name=IMAGE,
                        key_name="kimi-key", labels=["someone-else"])
    base.clear_requests()
    with pytest.raises(ProvisioningError, match="without our labels"):
        VirtualMachineProvider().create(vm_props())
    assert base.calls("POST") == [] and vm_names(base) == ["kimi-node-0"]


def test_an_errored_vm_left_by_an_earlier_run_is_replaced(base):
    base.inject(VmError())
    p = vm_props()
    left = raw(base).create_vm(name=p["name"], environment_name="kimi-env", flavor_name=FLAVOR, image_name=IMAGE,
                               key_name="kimi-key", labels=p["labels"])
    time.sleep(0.15)  # past CREATING and BUILD: it is in ERROR now
    created = VirtualMachineProvider().create(p)
    assert created.id != str(left["id"]) and vm_names(base) == ["kimi-node-0"]


def test_unknown_create_outcome_without_a_vm_fails_without_retrying_the_post(base):
    base.inject(ServerError(count=1, method="POST", path="/core/virtual-machines"))
    with pytest.raises(ProvisioningError, match="unknown outcome"):
        VirtualMachineProvider().create(vm_props())
    assert len(base.calls("POST")) == 1 and vm_names(base) == []


# --- failures after the POST: nothing left billing ----------------------------------------------------------------

def test_vm_in_error_is_deleted_and_the_reason_reported(base):
    base.inject(VmError(reason="No valid host was found. There are not enough hosts available."))
    with pytest.raises(ProvisioningError) as info:
        VirtualMachineProvider().create(vm_props())
    message = str(info.value)
    assert "went to ERROR" in message and "No valid host was found" in message
    assert "was deleted, nothing is left billing" in message
    assert base.inventory()["virtual_machines"] == []


def test_vm_stuck_in_build_is_deleted_at_the_deadline(base):
    base.inject(StuckInBuild())
    with pytest.raises(ProvisioningError) as info:
        VirtualMachineProvider().create(vm_props(create_timeout_seconds=0.4))
    message = str(info.value)
    assert "gave up after 0.4 s waiting for VM 'kimi-node-0'" in message and "to be ACTIVE" in message
    assert "last seen: status=BUILD" in message and "nothing is left billing" in message
    assert base.inventory()["virtual_machines"] == []


def test_a_failed_cleanup_says_the_vm_may_still_bill(base):
    base.inject(StuckInBuild(), ServerError(count=10_000, method="DELETE"))
    with pytest.raises(ProvisioningError) as info:
        VirtualMachineProvider().create(vm_props(create_timeout_seconds=0.2, delete_timeout_seconds=0.2))
    assert "ALSO FAILED" in str(info.value) and "may still be billing" in str(info.value)
    base.clear_faults()


# --- bad input: refused before any billable call ------------------------------------------------------------------

@pytest.mark.parametrize("change, fault, fragments", [
    ({"flavor_name": "n9-imaginary"}, None, ["'n9-imaginary' is not offered in CANADA-1", "n3-H100x8-NVLink"]),
    ({}, OutOfStock(FLAVOR), ["out of stock", "in stock now: ", "n3-B300-SXM6x8"]),
    ({"image_name": "Windows 95"}, None, ["'Windows 95' is not available in CANADA-1",
                                          "Ubuntu Server 24.04 LTS R595 CUDA 13.2 with Docker"]),
    ({"region": "MARS-1"}, None, ["unknown region 'MARS-1'", "CANADA-1, NORWAY-1, US-1"]),
])
def test_bad_catalog_input_fails_listing_options_with_zero_billable_calls(base, change, fault, fragments):
    if fault:
        base.inject(fault)
    with pytest.raises(ProvisioningError) as info:
        VirtualMachineProvider().create(vm_props(**change))
    for fragment in fragments:
        assert fragment in str(info.value)
    assert mutating_calls(base) == []
    assert base.inventory()["virtual_machines"] == []


def test_unknown_region_for_an_environment_lists_regions_and_creates_nothing(hs):
    with pytest.raises(ProvisioningError, match="unknown region 'MARS-1'; Hyperstack offers: CANADA-1"):
        EnvironmentProvider().create(env_props(region="MARS-1"))
    assert mutating_calls(hs) == []


def test_a_4xx_on_create_is_raised_and_nothing_is_looked_up_or_left(base):
    with pytest.raises(HyperstackError) as info:
        VirtualMachineProvider().create(vm_props(key_name="no-such-key"))
    assert info.value.status == 404 and "no-such-key" in str(info.value)
    assert len(base.calls("POST")) == 1 and vm_names(base) == []


def test_check_refuses_bad_inputs_before_any_call(hs):
    assert [f.property for f in VirtualMachineProvider().check({}, vm_props(name="n" * 51)).failures] == ["name"]
    private = "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----"
    assert [f.property for f in KeypairProvider().check({}, keypair_props(public_key=private)).failures] == \
        ["public_key"]
    bad_rule = rule_props("1", protocol="http", remote_ip_prefix="not-a-cidr", port_range_min=70000)
    assert {f.property for f in SecurityRuleProvider().check({}, bad_rule).failures} == \
        {"port_range_min", "protocol", "remote_ip_prefix"}
    unknown = rule_props(UNKNOWN, remote_ip_prefix=UNKNOWN)
    assert SecurityRuleProvider().check({}, unknown).failures == []  # preview: values not known yet
    with pytest.raises(ProvisioningError, match="private key"):
        KeypairProvider().create(keypair_props(public_key=private))
    assert hs.requests == []


# --- credentials --------------------------------------------------------------------------------------------------

def test_revoked_key_fails_clearly_before_anything_is_created(base, monkeypatch):
    revoked = "sk-revoked-0123456789"
    monkeypatch.setenv("HYPERSTACK_API_KEY", revoked)
    for provider, props in [(VirtualMachineProvider(), vm_props()), (EnvironmentProvider(), env_props("other")),
                            (KeypairProvider(), keypair_props("k9"))]:
        with pytest.raises(HyperstackError) as info:
            provider.create(props)
        assert info.value.status == 401 and revoked not in str(info.value)
        assert "HYPERSTACK_API_KEY" in str(info.value)
    assert base.calls("POST") == [] and vm_names(base) == []


def test_missing_key_fails_before_any_request(hs, monkeypatch):
    monkeypatch.delenv("HYPERSTACK_API_KEY")
    with pytest.raises(HyperstackError, match="hyperstack:apiKey.*HYPERSTACK_API_KEY"):
        VirtualMachineProvider().create(vm_props())
    assert hs.requests == []


def test_a_rotated_key_still_destroys_everything(base, monkeypatch):
    vm = VirtualMachineProvider().create(vm_props())
    rule = SecurityRuleProvider().create(rule_props(vm.id))
    base.add_api_key("sk-new-key")
    base.inject(RevokeKey(DEFAULT_API_KEY))
    monkeypatch.setenv("HYPERSTACK_API_KEY", "sk-new-key")
    keypair_id = str(base.inventory()["keypairs"][0]["id"])
    env_id = str(base.inventory()["environments"][0]["id"])
    SecurityRuleProvider().delete(rule.id, rule.outs)
    VirtualMachineProvider().delete(vm.id, vm.outs)
    KeypairProvider().delete(keypair_id, keypair_props())
    EnvironmentProvider().delete(env_id, env_props())
    assert base.inventory() == EMPTY


def test_stack_config_url_wins_and_the_environment_key_wins(base, monkeypatch):
    vm = VirtualMachineProvider().create(vm_props())
    base.add_api_key("sk-from-env")
    base.inject(RevokeKey(DEFAULT_API_KEY))
    monkeypatch.setenv("HYPERSTACK_API_URL", "http://127.0.0.1:9/v1")  # wrong on purpose: the config's URL wins
    monkeypatch.setenv("HYPERSTACK_API_KEY", "sk-from-env")
    config = {"hyperstack:apiKey": DEFAULT_API_KEY, "hyperstack:apiUrl": base.base_url, "other:thing": "x"}
    VirtualMachineProvider().configure(ConfigureRequest(Config(config, "kimi-cluster")))
    assert providers._HOST_CONFIG == {"hyperstack:apiKey": DEFAULT_API_KEY, "hyperstack:apiUrl": base.base_url}
    provider = VirtualMachineProvider()
    assert vars(provider) == {}  # nothing on the object that gets pickled into state
    provider.delete(vm.id, vm.outs)
    assert vm_names(base) == []


def test_a_key_rotated_after_up_destroys_when_exported(hs, monkeypatch):
    """`up` with hyperstack:apiKey; the key is rotated; `destroy` configures the providers from the config stored
    in state (the old key) and HYPERSTACK_API_KEY carries the new one, as the README says."""
    old, new = "sk-before-rotation", "sk-after-rotation"
    hs.add_api_key(old)
    monkeypatch.delenv("HYPERSTACK_API_KEY")
    stored = {"hyperstack:apiKey": old, "hyperstack:apiUrl": hs.base_url}
    EnvironmentProvider().configure(ConfigureRequest(Config(stored, "kimi-cluster")))
    env = EnvironmentProvider().create(env_props())
    key = KeypairProvider().create(keypair_props())
    vm = VirtualMachineProvider().create(vm_props())
    rule = SecurityRuleProvider().create(rule_props(vm.id))

    hs.add_api_key(new)
    hs.inject(RevokeKey(old))
    hs.inject(RevokeKey(DEFAULT_API_KEY))
    providers._HOST_CONFIG.clear()  # a new `pulumi destroy`: a fresh provider host, configured from state
    VirtualMachineProvider().configure(ConfigureRequest(Config(stored, "kimi-cluster")))
    with pytest.raises(HyperstackError) as info:  # without the documented export: the stale key, refused
        SecurityRuleProvider().delete(rule.id, rule.outs)
    assert info.value.status == 401 and "HYPERSTACK_API_KEY" in str(info.value)

    monkeypatch.setenv("HYPERSTACK_API_KEY", new)
    SecurityRuleProvider().delete(rule.id, rule.outs)
    VirtualMachineProvider().delete(vm.id, vm.outs)
    KeypairProvider().delete(key.id, key.outs)
    EnvironmentProvider().delete(env.id, env.outs)
    assert hs.inventory() == EMPTY


# --- deletes ------------------------------------------------------------------------------------------------------

def test_delete_while_creating_is_retried_until_allowed(base):
    base.lifecycle.creating_seconds = 0.3
    vm = raw(base).create_vm(name="young", environment_name="kimi-env", flavor_name=FLAVOR, image_name=IMAGE,
                             key_name="kimi-key")
    VirtualMachineProvider().delete(str(vm["id"]), {"name": "young", "poll_interval_seconds": 0.02,
                                                    "delete_timeout_seconds": 3})
    statuses = [r.status for r in base.calls("DELETE")]
    assert statuses[0] == 409 and statuses[-1] == 200 and vm_names(base) == []


def test_delete_while_creating_gives_up_at_its_deadline(base):
    base.lifecycle.creating_seconds = 30
    vm = raw(base).create_vm(name="young", environment_name="kimi-env", flavor_name=FLAVOR, image_name=IMAGE,
                             key_name="kimi-key")
    with pytest.raises(ProvisioningError, match="gave up after 0.2 s waiting for VM 'young'.*accept deletion"):
        VirtualMachineProvider().delete(str(vm["id"]), {"name": "young", "poll_interval_seconds": 0.02,
                                                        "delete_timeout_seconds": 0.2})


def test_delete_of_an_already_gone_vm_rule_or_keypair_succeeds(base):
    vm = VirtualMachineProvider().create(vm_props())
    rule = SecurityRuleProvider().create(rule_props(vm.id))
    VirtualMachineProvider().delete(vm.id, vm.outs)
    VirtualMachineProvider().delete(vm.id, vm.outs)  # 404 on DELETE is success
    SecurityRuleProvider().delete(rule.id, rule.outs)  # its VM is gone: nothing to do
    keypair_id = str(base.inventory()["keypairs"][0]["id"])
    KeypairProvider().delete(keypair_id, keypair_props())
    KeypairProvider().delete(keypair_id, keypair_props())
    left = base.inventory()
    assert left["virtual_machines"] == [] and left["keypairs"] == []


def test_environment_delete_waits_while_children_drain(base):
    base.lifecycle.deleting_seconds = 0.2
    vm = VirtualMachineProvider().create(vm_props())
    raw(base).delete_vm(int(vm.id))  # DELETING for a while: the environment still has a child
    KeypairProvider().delete(str(base.inventory()["keypairs"][0]["id"]), keypair_props())
    env_id = str(base.inventory()["environments"][0]["id"])
    EnvironmentProvider().delete(env_id, env_props())
    statuses = [r.status for r in base.calls("DELETE", "/core/environments/*")]
    assert statuses[0] == 405 and statuses[-1] == 200
    assert base.inventory() == EMPTY


def test_environment_delete_gives_up_when_children_stay(base):
    env_id = str(base.inventory()["environments"][0]["id"])
    with pytest.raises(ProvisioningError, match="environment 'kimi-env' to accept deletion.*405"):
        EnvironmentProvider().delete(env_id, env_props(delete_timeout_seconds=0.1))


# --- read: drift and things deleted outside Pulumi ----------------------------------------------------------------

def test_read_reports_resources_deleted_outside_pulumi_as_gone(base):
    vm = VirtualMachineProvider().create(vm_props())
    rule = SecurityRuleProvider().create(rule_props(vm.id))
    api = raw(base)
    api.delete_vm_security_rule(int(vm.id), int(rule.id))
    assert SecurityRuleProvider().read(rule.id, rule.outs).id == ""
    api.delete_vm(int(vm.id))
    assert VirtualMachineProvider().read(vm.id, vm.outs).id == ""  # still DELETING: going away
    wait_gone(base, int(vm.id))
    assert VirtualMachineProvider().read(vm.id, vm.outs).id == ""
    keypair = base.inventory()["keypairs"][0]
    api.delete_keypair(keypair["id"])
    assert KeypairProvider().read(str(keypair["id"]), keypair_props()).id == ""
    env = base.inventory()["environments"][0]
    api.delete_environment(env["id"])
    assert EnvironmentProvider().read(str(env["id"]), env_props()).id == ""


def test_read_picks_up_label_drift_so_the_next_diff_restores_it(base):
    vm = VirtualMachineProvider().create(vm_props())
    raw(base).set_vm_labels(int(vm.id), ["tampered"])
    read = VirtualMachineProvider().read(vm.id, vm.outs)
    assert read.outs["labels"] == ["tampered"]
    diff = VirtualMachineProvider().diff(vm.id, read.outs, vm_props())
    assert diff.changes is True and diff.replaces == []


# --- transient faults along the way -------------------------------------------------------------------------------

def test_rate_limit_bursts_and_5xx_on_polls_are_ridden_out(base):
    base.inject(RateLimit(count=3), ServerError(count=5, method="GET", path="/core/virtual-machines/*"))
    created = VirtualMachineProvider().create(vm_props())
    assert created.outs["status"] == "ACTIVE" and vm_names(base) == ["kimi-node-0"]
    assert [r.status for r in base.requests[:3]] == [429, 429, 429]


def test_environment_and_keypair_creates_are_idempotent_by_name(hs):
    first = EnvironmentProvider().create(env_props())
    assert EnvironmentProvider().create(env_props()).id == first.id
    key = KeypairProvider().create(keypair_props())
    assert KeypairProvider().create(keypair_props()).id == key.id
    with pytest.raises(ProvisioningError, match="another public key"):
        KeypairProvider().create(keypair_props(public_key=OTHER_KEY))
    with pytest.raises(ProvisioningError, match="already exists in CANADA-1"):
        EnvironmentProvider().create(env_props(region="NORWAY-1"))
    assert len(hs.inventory()["environments"]) == 1 and len(hs.inventory()["keypairs"]) == 1


@pytest.mark.parametrize("mode", ["500", "drop"])
def test_lost_create_answers_for_rules_environments_and_keypairs_are_adopted(hs, mode):
    hs.inject(LostCreateResponse(mode=mode, path="/core/environments"))
    env = EnvironmentProvider().create(env_props())
    hs.inject(LostCreateResponse(mode=mode, path="/core/keypairs"))
    key = KeypairProvider().create(keypair_props())
    vm = VirtualMachineProvider().create(vm_props())
    hs.inject(LostCreateResponse(mode=mode, path="/core/virtual-machines/*/sg-rules"))
    rule = SecurityRuleProvider().create(rule_props(vm.id))
    inventory = hs.inventory()
    assert [str(e["id"]) for e in inventory["environments"]] == [env.id]
    assert [str(k["id"]) for k in inventory["keypairs"]] == [key.id]
    assert [str(r["id"]) for r in inventory["security_rules"]] == [rule.id]
    assert len(hs.calls("POST", "/core/virtual-machines/*/sg-rules")) == 1


def test_a_5xx_on_a_rule_create_that_did_nothing_is_raised(base):
    vm = VirtualMachineProvider().create(vm_props())
    base.inject(ServerError(count=1, method="POST", path="/core/virtual-machines/*/sg-rules"))
    with pytest.raises(HyperstackError) as info:
        SecurityRuleProvider().create(rule_props(vm.id))
    assert info.value.status == 500 and base.inventory()["security_rules"] == []


def test_user_data_never_comes_back_in_outputs(base):
    marker = "-----BEGIN OPENSSH PRIVATE KEY----- host-key-canary"
    p = vm_props(user_data=f"#cloud-config\nssh_keys:\n  ed25519_private: {marker}\n")
    provider = VirtualMachineProvider()
    created = provider.create(p)
    updated = provider.update(created.id, created.outs, {**p, "labels": ["kimi-cluster", "stack-test", "x"]})
    read = provider.read(created.id, updated.outs)
    for outs in (created.outs, updated.outs, read.outs):
        assert marker not in repr(outs)
    assert provider.diff(created.id, read.outs, p).replaces == []  # the digest alone still detects no change


def test_a_vm_create_logs_each_state_change_with_the_time_waited_and_what_comes_next(base, monkeypatch):
    # Phases long enough for the 10 ms polls to see each state even on a loaded machine (the fast default gives
    # ACTIVE-without-its-IP 30 ms, which a slow poll can step over).
    base.lifecycle.build_seconds = base.lifecycle.floating_ip_seconds = 0.3
    lines: list[str] = []
    monkeypatch.setattr(pulumi.log, "info", lambda message, *args, **kwargs: lines.append(message))
    VirtualMachineProvider().create(vm_props())
    mine = [line for line in lines if line.startswith("kimi-node-0: ")]
    states = [line.split(": ", 1)[1] for line in mine]
    assert states[0] in ("CREATING; waiting for ACTIVE", "BUILD; waiting for ACTIVE"), mine
    assert re.fullmatch(r"ACTIVE without its floating IP → ACTIVE after \d+ s", states[-1]), mine
    assert any(re.fullmatch(r"BUILD → ACTIVE without its floating IP after \d+ s; waiting for the floating IP", s)
               for s in states), mine


def test_a_vm_delete_logs_the_wait_for_404(base, monkeypatch):
    # DELETING lasts far longer than the first GET takes even on a loaded machine (at the suite's 0.05 s, a first GET
    # that came late found the VM already gone and logged no DELETING line).
    base.lifecycle.deleting_seconds = 0.5
    vm = VirtualMachineProvider().create(vm_props())
    lines: list[str] = []
    monkeypatch.setattr(pulumi.log, "info", lambda message, *args, **kwargs: lines.append(message))
    VirtualMachineProvider().delete(vm.id, vm.outs)
    assert f"VM 'kimi-node-0' (id {vm.id}): DELETING; waiting for GET to answer 404" in lines
    assert any(re.fullmatch(rf"VM 'kimi-node-0' \(id {vm.id}\): DELETING → gone \(GET answers 404\) after \d+ s", line)
               for line in lines), lines


def test_each_429_backoff_is_logged_with_its_delay(base, monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(pulumi.log, "info", lambda message, *args, **kwargs: lines.append(message))
    base.inject(RateLimit(count=2, method="POST"))
    EnvironmentProvider().create(env_props("limited"))
    assert lines == [
        "Hyperstack POST /core/environments: HTTP 429 (rate limited), retrying in 0.005 s (try 2 of 5)",
        "Hyperstack POST /core/environments: HTTP 429 (rate limited), retrying in 0.01 s (try 3 of 5)",
    ]


@pytest.mark.parametrize("mode", ["delete", "error"])
def test_a_vm_the_cloud_took_away_is_replaced_by_the_next_up(base, mode: str):
    """A reclaim (deleted, or left in ERROR) makes the VM's diff a replacement: `pulumi up` alone brings it back."""
    vm_p = providers.VirtualMachineProvider()
    vm = vm_p.create(vm_props())
    assert vm_p.diff(vm.id, vm.outs, vm_props()).changes is False
    base.reclaim("kimi-node-0", mode)
    time.sleep(0.5)  # past the emulator's deleting time
    diff = vm_p.diff(vm.id, vm.outs, vm_props())
    assert diff.changes is True and diff.replaces == ["name"] and diff.delete_before_replace is True
    vm_p.delete(vm.id, vm.outs)  # a 404 (or an ERROR VM deleted) counts as done
    again = vm_p.create(vm_props())
    assert again.id != vm.id and again.outs["status"] == "ACTIVE"
