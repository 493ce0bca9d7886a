"""Contract tests: the emulator and our client agree with the vendor's OpenAPI-generated SDK (`hyperstack`).

Our request bodies must validate against the SDK's request models; the emulator's answers must parse into its
response models without fields the SDK does not know; the SDK's own client must drive the emulator end to end.
"""

from __future__ import annotations

import functools
import importlib
import time
from types import ModuleType
from typing import Any

import pytest
import requests

from kimi_cluster.deploy.hyperstack_providers import providers, rule_inputs
from kimi_cluster.fakes.hyperstack_emulator.catalog import IMAGES
from kimi_cluster.fakes.hyperstack_emulator.emulator import DEFAULT_API_KEY, Emulator
from kimi_cluster.fakes.hyperstack_emulator.faults import VmError
from tests.hyperstack.conftest import FLAVOR, IMAGE, PUBLIC_KEY, REGION, env_props, keypair_props, rule_props, vm_props

# A guard against a hung emulator, not a speed check: the SDK model's first schema build alone passed 30 s on two
# cores with other suites running beside this one.
pytestmark = pytest.mark.timeout(180)


@functools.cache
def sdk() -> ModuleType:
    """The vendor SDK, imported by the first test that needs it: the SDK takes about 2 CPU-seconds to import, and
    every xdist worker imports every test module when it collects. (Not a module-level lazy module: collection reads
    attributes of every global of a test module, which would import it there and then.)"""
    return importlib.import_module("hyperstack")

# Request models by name, looked up on the SDK when a test needs one.
REQUEST_MODELS = {
    ("POST", "/core/environments"): "CreateEnvironment",
    ("POST", "/core/keypairs"): "ImportKeypairPayload",
    ("POST", "/core/virtual-machines"): "CreateInstancesPayload",
    ("POST", "/core/virtual-machines/*/sg-rules"): "CreateSecurityRulePayload",
    ("PUT", "/core/virtual-machines/*/label"): "EditLabelOfAnExistingVMPayload",
}


def _lost_keys(sent: Any, parsed: Any, where: str = "") -> list[str]:
    """Keys with a value in `sent` that did not survive a parse/serialize round trip through an SDK model."""
    if isinstance(sent, dict) and isinstance(parsed, dict):
        lost = []
        for key, value in sent.items():
            if value is None:
                continue
            if key not in parsed:
                lost.append(f"{where}.{key}")
            else:
                lost += _lost_keys(value, parsed[key], f"{where}.{key}")
        return lost
    if isinstance(sent, list) and isinstance(parsed, list):
        return [k for s, p in zip(sent, parsed, strict=False) for k in _lost_keys(s, p, where + "[]")]
    return []


def _model_for(method: str, path: str):
    import fnmatch
    return next((getattr(sdk(), m) for (verb, pattern), m in REQUEST_MODELS.items()
                 if verb == method and fnmatch.fnmatch(path, pattern)), None)


def test_every_body_our_providers_send_validates_against_the_sdk(base):
    vm = providers.VirtualMachineProvider()
    created = vm.create(vm_props())
    vm.update(created.id, created.outs, {**created.outs, "labels": ["kimi-cluster", "stack-test", "role-head"]})
    rule = providers.SecurityRuleProvider().create(rule_props(created.id))
    providers.SecurityRuleProvider().create(rule_props(created.id, protocol="any", port_range_min=None,
                                                       port_range_max=None, remote_ip_prefix="10.0.0.5/32"))
    providers.SecurityRuleProvider().delete(rule.id, rule.outs)
    vm.delete(created.id, created.outs)
    # The base fixture's environment and keypair bodies were recorded before it cleared the log: redo them.
    providers.EnvironmentProvider().create(env_props("second-env"))
    providers.KeypairProvider().create(keypair_props(environment_name="second-env"))

    checked = 0
    for request in base.requests:
        if request.body is None:
            continue
        model = _model_for(request.method, request.path)
        assert model is not None, f"no SDK model mapped for {request.method} {request.path}"
        parsed = model.from_dict(request.body)  # raises on a missing field, a wrong type, a bad enum value
        round_trip = parsed.to_dict()
        assert _lost_keys(request.body, round_trip) == [], (request.method, request.path)
        assert {k: round_trip[k] for k, v in request.body.items() if v is not None} == \
            {k: v for k, v in request.body.items() if v is not None}
        checked += 1
    assert {r.method + " " + r.path.split("/")[2] for r in base.requests if r.body is not None} >= {
        "POST virtual-machines", "PUT virtual-machines", "POST environments", "POST keypairs"}
    assert checked >= 6


def _get(emu: Emulator, path: str, key: str = DEFAULT_API_KEY, method: str = "GET", **kw) -> requests.Response:
    return requests.request(method, emu.base_url + path, headers={"api_key": key}, timeout=5, **kw)


def _parses(model, response: requests.Response) -> None:
    data = response.json()
    parsed = model.from_json(response.text)
    assert parsed is not None
    assert _lost_keys(data, parsed.to_dict()) == [], f"{model.__name__}: fields the SDK does not know"


def test_every_emulator_answer_parses_into_the_sdk_models(base):
    hyperstack = sdk()
    vm = providers.VirtualMachineProvider().create(vm_props())
    providers.SecurityRuleProvider().create(rule_props(vm.id))
    emu = base
    env_id = emu.inventory()["environments"][0]["id"]
    _parses(hyperstack.Environments, _get(emu, "/core/environments"))
    _parses(hyperstack.Environment, _get(emu, f"/core/environments/{env_id}"))
    _parses(hyperstack.Keypairs, _get(emu, "/core/keypairs"))
    _parses(hyperstack.Instances, _get(emu, "/core/virtual-machines"))
    _parses(hyperstack.Instance, _get(emu, f"/core/virtual-machines/{vm.id}"))
    _parses(hyperstack.InstanceEvents, _get(emu, f"/core/virtual-machines/{vm.id}/events"))
    _parses(hyperstack.FlavorListResponse, _get(emu, f"/core/flavors?region={REGION}"))
    _parses(hyperstack.FlavorListResponse, _get(emu, "/core/flavors"))
    _parses(hyperstack.Images, _get(emu, f"/core/images?region={REGION}"))
    _parses(hyperstack.Regions, _get(emu, "/core/regions"))
    _parses(hyperstack.SecurityRulesProtocolFields, _get(emu, "/core/sg-rules-protocols"))
    rule = _get(emu, f"/core/virtual-machines/{vm.id}/sg-rules", method="POST",
                json={"direction": "ingress", "protocol": "udp", "ethertype": "IPv4",
                      "remote_ip_prefix": "10.1.1.1/32"})
    _parses(hyperstack.SecurityGroupRule, rule)
    _parses(hyperstack.ResponseModel, _get(emu, f"/core/virtual-machines/{vm.id}/label", method="PUT",
                                           json={"labels": ["a"]}))
    created = _get(emu, "/core/virtual-machines", method="POST", json={
        "name": "raw", "environment_name": "kimi-env", "flavor_name": FLAVOR, "image_name": IMAGE,
        "key_name": "kimi-key", "count": 1})
    _parses(hyperstack.CreateInstancesResponse, created)
    _parses(hyperstack.ImportKeypairResponse, _get(emu, "/core/keypairs", method="POST", json={
        "name": "k2", "environment_name": "kimi-env", "public_key": PUBLIC_KEY}))

    errors = {
        401: _get(emu, "/core/regions", key="wrong"),
        404: _get(emu, "/core/virtual-machines/999999"),
        409: _get(emu, "/core/environments", method="POST", json={"name": "kimi-env", "region": REGION}),
        405: _get(emu, f"/core/environments/{env_id}", method="DELETE"),
        400: _get(emu, "/core/environments", method="POST", json={"name": "x" * 51, "region": REGION}),
    }
    for status, response in errors.items():
        assert response.status_code == status
        _parses(hyperstack.ErrorResponseModel, response)
        body = response.json()
        assert body["status"] is False and body["error_reason"] and body["message"]


@pytest.mark.parametrize("body, fragment", [
    ({"name": "a", "region": REGION, "extra": 1}, "unknown field"),
    ({"region": REGION}, "name: field required"),
    ({"name": 5, "region": REGION}, "expected str"),
    ({"name": "n" * 51, "region": REGION}, "at most 50"),
])
def test_emulator_rejects_what_the_sdk_model_rejects(emu, body, fragment):
    hyperstack = sdk()
    response = _get(emu, "/core/environments", method="POST", json=body)
    assert response.status_code == 400 and fragment in response.json()["message"]
    if "extra" not in body:  # the SDK ignores unknown fields; every other case it refuses too
        with pytest.raises(ValueError):  # pydantic's ValidationError
            hyperstack.CreateEnvironment.from_dict(body)


def test_stocks_and_pricebook_parse_into_the_sdk_models_and_the_sdk_reads_them(emu):
    hyperstack = sdk()
    _parses(hyperstack.NewStockRetriveResponse, _get(emu, "/core/stocks"))
    book = _get(emu, "/pricebook")
    assert isinstance(book.json(), list) and book.json()  # a bare array, no envelope
    for entry in book.json():
        parsed = hyperstack.PricebookModel.from_dict(entry)
        assert _lost_keys(entry, parsed.to_dict()) == [], "PricebookModel: fields the SDK does not know"
    assert _get(emu, "/pricebook", key="wrong").status_code == 401
    assert _get(emu, "/core/stocks", key="wrong").status_code == 401

    emu.set_capacity(FLAVOR, 3, region="NORWAY-1")
    emu.set_price("H100-80G-PCIe-NVLink", 2.25)
    config = hyperstack.Configuration(host=emu.base_url, api_key={"apiKey": DEFAULT_API_KEY})
    with hyperstack.ApiClient(config) as client:
        stocks = hyperstack.StockApi(client).get_gpu_stock().stocks
        norway = next(s for s in stocks if s.region == "NORWAY-1")
        h100 = next(m for m in norway.models if m.model == "H100-80G-PCIe-NVLink")
        assert norway.stock_type == "GPU" and h100.configurations.var_8x == 3 and h100.available == "24+"
        prices = {p.name: p for p in hyperstack.PricebookApi(client).get_pricebook()}
        assert prices["H100-80G-PCIe-NVLink"].value == 2.25 and prices["H100-80G-PCIe-NVLink"].original_value == 2.6


def test_rule_protocol_enum_matches_the_sdk(emu):
    hyperstack = sdk()
    from kimi_cluster.fakes.hyperstack_emulator.catalog import PROTOCOLS
    field = hyperstack.CreateSecurityRulePayload.model_fields["protocol"]
    assert field is not None
    for protocol in PROTOCOLS:
        hyperstack.CreateSecurityRulePayload(direction="ingress", ethertype="IPv4", protocol=protocol,
                                             remote_ip_prefix="0.0.0.0/0")
    assert set(PROTOCOLS) == set(rule_inputs.PROTOCOLS)
    with pytest.raises(ValueError):
        hyperstack.CreateSecurityRulePayload(direction="ingress", ethertype="IPv4", protocol="http",
                                             remote_ip_prefix="0.0.0.0/0")


def _wait(predicate, what: str, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_vendor_sdk_drives_the_emulator_end_to_end(emu):
    hyperstack = sdk()
    from hyperstack.exceptions import ApiException

    config = hyperstack.Configuration(host=emu.base_url, api_key={"apiKey": DEFAULT_API_KEY})
    with hyperstack.ApiClient(config) as client:
        envs, keys = hyperstack.EnvironmentApi(client), hyperstack.KeypairApi(client)
        vms, events = hyperstack.VirtualMachineApi(client), hyperstack.VirtualMachineEventsApi(client)

        regions = [r.name for r in hyperstack.RegionApi(client).list_regions().regions]
        assert REGION in regions
        flavors = hyperstack.FlavorApi(client).list_flavors(region=REGION).data
        names = {f.name: f for group in flavors for f in group.flavors}
        assert names["n3-H100x8-NVLink"].gpu == "H100-80G-PCIe-NVLink" and names["n3-H100x8-NVLink"].cpu == 252
        assert names["n3-B300-SXM6x8"].gpu_count == 8
        images = hyperstack.ImageApi(client).list_images(region=REGION).images
        assert IMAGE in {i.name for group in images for i in group.images}
        assert len({i["name"] for i in IMAGES if i["region_name"] == REGION}) >= 2

        env = envs.create_environment(hyperstack.CreateEnvironment(name="sdk-env", region=REGION)).environment
        assert envs.get_environment(env.id).environment.name == "sdk-env"
        with pytest.raises(ApiException) as dup:
            envs.create_environment(hyperstack.CreateEnvironment(name="sdk-env", region=REGION))
        assert dup.value.status == 409
        keypair = keys.import_key_pair(hyperstack.ImportKeypairPayload(
            name="sdk-key", environment_name="sdk-env", public_key=PUBLIC_KEY)).keypair
        assert keypair.fingerprint and keys.list_key_pairs().keypairs[0].name == "sdk-key"

        emu.inject(VmError(name="sdk-broken"))
        made = vms.create_vms(hyperstack.CreateInstancesPayload(
            name="sdk-vm", environment_name="sdk-env", flavor_name=FLAVOR, image_name=IMAGE, key_name="sdk-key",
            count=1, assign_floating_ip=True, labels=["sdk"])).instances[0]
        assert made.status == "CREATING" and made.floating_ip is None
        with pytest.raises(ApiException) as creating:
            vms.delete_vm(made.id)
        assert creating.value.status == 409 and "being created" in creating.value.body

        active = _wait(lambda: (lambda i: i if i.status == "ACTIVE" and i.floating_ip else None)(
            vms.get_vm(made.id).instance), "sdk-vm ACTIVE with a floating IP")
        assert active.floating_ip_status == "ATTACHED" and active.fixed_ip.startswith("127.")
        rule = vms.create_firewall_rule_for_vm(made.id, hyperstack.CreateSecurityRulePayload(
            direction="ingress", ethertype="IPv4", protocol="tcp", remote_ip_prefix="203.0.113.7/32",
            port_range_min=22, port_range_max=22)).security_rule
        assert [r.id for r in vms.get_vm(made.id).instance.security_rules] == [rule.id]
        vms.add_vm_label(made.id, hyperstack.EditLabelOfAnExistingVMPayload(labels=["sdk", "relabelled"]))
        assert vms.get_vm(made.id).instance.labels == ["sdk", "relabelled"]
        assert [i.name for i in vms.list_vms(environment="sdk-env").instances] == ["sdk-vm"]

        broken = vms.create_vms(hyperstack.CreateInstancesPayload(
            name="sdk-broken", environment_name="sdk-env", flavor_name=FLAVOR, image_name=IMAGE,
            key_name="sdk-key", count=1)).instances[0]
        _wait(lambda: vms.get_vm(broken.id).instance.status == "ERROR", "sdk-broken in ERROR")
        assert any(e.type == "error" for e in events.list_vm_events(broken.id).instance_events)

        with pytest.raises(ApiException) as busy:
            envs.delete_environment(env.id)
        assert busy.value.status == 405

        vms.delete_firewall_rule_for_vm(made.id, rule.id)
        for vm_id in (made.id, broken.id):
            vms.delete_vm(vm_id)
            assert vms.get_vm(vm_id).instance.status == "DELETING"
        for vm_id in (made.id, broken.id):
            def gone(vm_id=vm_id) -> bool:
                try:
                    vms.get_vm(vm_id)
                except ApiException as err:
                    return err.status == 404
                return False
            _wait(gone, f"VM {vm_id} to be gone")
        keys.delete_key_pair(keypair.id)
        envs.delete_environment(env.id)
        with pytest.raises(ApiException) as missing:
            envs.get_environment(env.id)
        assert missing.value.status == 404
    assert emu.inventory() == {"environments": [], "keypairs": [], "virtual_machines": [], "security_rules": []}


@pytest.mark.timeout(20)
def test_command_line_emulator_serves_until_interrupted():
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERSTACK_")}
    proc = subprocess.Popen([sys.executable, "-m", "kimi_cluster.cli.emulator", "--port", "0", "--api-key", "cli-key",
                             "--build-seconds", "0.01"], cwd=Path(__file__).resolve().parents[2], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        banner = proc.stdout.readline()
        assert "cli-key" not in banner  # the banner says where the key came from, never the key
        url = banner.split(" on ")[1].split()[0]
        answer = requests.get(url + "/core/regions", headers={"api_key": "cli-key"}, timeout=5)
        assert answer.status_code == 200 and answer.json()["regions"]
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0


# --- hostile clients: 4xx for malformed requests, a socket timeout for slow ones -----------------------------------

def _raw_request(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(data)
        chunks = []
        while True:
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


@pytest.mark.parametrize("headers,body,status", [
    ("Content-Length: abc", b"", b"400"),
    ("Content-Length: -5", b"", b"400"),
    (f"Content-Length: {10**9}", b"", b"413"),
    ("Transfer-Encoding: chunked", b"5\r\nhello\r\n0\r\n\r\n", b"411"),
    ("Content-Length: 4", b"\xff\xfe{}", b"400"),
])
def test_malformed_requests_get_a_4xx(headers, body, status):
    from kimi_cluster.fakes.hyperstack_emulator.emulator import DEFAULT_API_KEY, Emulator

    with Emulator() as emu:
        head = (f"POST /v1/core/environments HTTP/1.1\r\nHost: x\r\napi_key: {DEFAULT_API_KEY}\r\n{headers}\r\n"
                "Connection: close\r\n\r\n").encode()
        answer = _raw_request(emu.port, head + body)
        assert answer.split(b" ", 2)[1] == status, answer[:200]


def test_a_client_that_stops_sending_is_dropped_and_others_are_served():
    import socket
    import time

    from kimi_cluster.fakes.hyperstack_emulator.emulator import DEFAULT_API_KEY, Emulator
    from kimi_cluster.hyperstack_api.api import HyperstackClient

    with Emulator(socket_timeout=0.5) as emu:
        slow = socket.create_connection(("127.0.0.1", emu.port), timeout=5)
        slow.sendall(b"POST /v1/core/environments HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")  # and then nothing
        assert HyperstackClient(emu.base_url, DEFAULT_API_KEY).list_regions()  # served meanwhile
        started = time.monotonic()
        assert slow.recv(100) == b""  # closed by the emulator, not by us
        assert time.monotonic() - started < 3
        slow.close()
