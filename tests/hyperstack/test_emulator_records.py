"""The API's record shapes are written once (kimi_cluster/hyperstack_api/records.py): every key of every record the
emulator answers with is a key declared there, nested records included, so the client's view and the emulator's
cannot drift apart. (tests/hyperstack/test_emulator_contract.py checks the same answers against the vendor SDK.)"""

from __future__ import annotations

from typing import Any, get_args, get_origin, get_type_hints, is_typeddict

import pytest
import requests

from kimi_cluster.deploy.hyperstack_providers import providers
from kimi_cluster.fakes.hyperstack_emulator.emulator import DEFAULT_API_KEY, Emulator
from kimi_cluster.hyperstack_api import records as shapes
from tests.hyperstack.conftest import REGION, rule_props, vm_props

pytestmark = pytest.mark.timeout(30)


def _undeclared(value: Any, shape: Any, where: str) -> list[str]:
    """Keys of `value` that `shape` (a TypedDict, or a list of one) does not declare, recursively."""
    if get_origin(shape) is list:
        return [k for item in value for k in _undeclared(item, get_args(shape)[0], where + "[]")]
    if get_origin(shape) is not None or not is_typeddict(shape):
        return []  # a plain value, or a dict the records leave open (features, image restrictions)
    hints = get_type_hints(shape)
    found = [f"{where}.{key}" for key in value if key not in hints]
    for key, item in value.items():
        if key in hints and item is not None:
            found += _undeclared(item, hints[key], f"{where}.{key}")
    return found


def _get(emu: Emulator, path: str, method: str = "GET", **kw: Any) -> Any:
    answer = requests.request(method, emu.base_url + path, headers={"api_key": DEFAULT_API_KEY}, timeout=5, **kw)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_every_record_the_emulator_answers_with_is_declared_in_the_client_records(base: Emulator) -> None:
    vm = providers.VirtualMachineProvider().create(vm_props())
    providers.SecurityRuleProvider().create(rule_props(vm.id))
    env_id = base.inventory()["environments"][0]["id"]
    flavors = [f for group in _get(base, f"/core/flavors?region={REGION}")["data"] for f in group["flavors"]]
    images = [i for group in _get(base, f"/core/images?region={REGION}")["images"] for i in group["images"]]
    answers: list[tuple[Any, Any]] = [
        (_get(base, "/core/regions")["regions"], list[shapes.RegionRecord]),
        (_get(base, "/core/environments")["environments"], list[shapes.EnvironmentRecord]),
        (_get(base, f"/core/environments/{env_id}")["environment"], shapes.EnvironmentRecord),
        (_get(base, "/core/keypairs")["keypairs"], list[shapes.KeypairRecord]),
        (_get(base, "/core/virtual-machines")["instances"], list[shapes.VmRecord]),
        (_get(base, f"/core/virtual-machines/{vm.id}")["instance"], shapes.VmRecord),
        (_get(base, f"/core/virtual-machines/{vm.id}/events")["instance_events"], list[shapes.VmEventRecord]),
        (_get(base, f"/core/virtual-machines/{vm.id}/sg-rules", method="POST", json={
            "direction": "ingress", "protocol": "udp", "ethertype": "IPv4", "remote_ip_prefix": "10.1.1.1/32",
        })["security_rule"], shapes.SecurityRuleRecord),
        (flavors, list[shapes.FlavorRecord]),
        (images, list[shapes.ImageRecord]),
        (_get(base, "/pricebook"), list[shapes.PriceRecord]),
    ]
    assert all(value for value, _ in answers)  # each answer has a record to check
    assert [key for value, shape in answers for key in _undeclared(value, shape, str(shape))] == []
    # The check itself finds a key the records do not declare.
    assert _undeclared({"id": 1, "environment": {"org": 1}}, shapes.VmRecord, "vm") == ["vm.environment.org"]
