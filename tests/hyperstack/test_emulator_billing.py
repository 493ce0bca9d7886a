"""The emulator's read-only VM billing history against the vendor SDK's model and client, and the deploying side's
refusal of a budget already spent (kimi_cluster/deploy/caretaker_guard.py), which reads it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests

from kimi_cluster.blueprint.caretaker import gpu_vm_names
from kimi_cluster.deploy.caretaker_guard import budget_problem
from kimi_cluster.fakes.hyperstack_emulator.emulator import DEFAULT_API_KEY, Emulator
from kimi_cluster.node.caretaker_spend import spent_usd
from kimi_cluster.settings import Settings
from kimi_cluster.settings.loader import load_settings
from tests.hyperstack.conftest import FAST, IMAGE, PUBLIC_KEY, REGION
from tests.hyperstack.test_emulator_contract import _lost_keys, sdk

pytestmark = pytest.mark.timeout(30)
MINUTE_S = 0.05


def _call(emu: Emulator, method: str, path: str, key: str = DEFAULT_API_KEY, **kw):
    return requests.request(method, emu.base_url + path, headers={"api_key": key}, timeout=10, **kw)


@pytest.fixture
def billed() -> Iterator[Emulator]:
    with Emulator(lifecycle=FAST, billing_minute_seconds=MINUTE_S) as emu:
        _call(emu, "POST", "/core/environments", json={"name": "kimi-dev", "region": REGION})
        _call(emu, "POST", "/core/keypairs", json={"name": "k", "environment_name": "kimi-dev",
                                                   "public_key": PUBLIC_KEY})
        for name in ("kimi-dev-node0", "kimi-dev-node1"):
            assert _call(emu, "POST", "/core/virtual-machines", json={
                "name": name, "environment_name": "kimi-dev", "flavor_name": "n3-H100x8-NVLink",
                "image_name": IMAGE, "key_name": "k", "count": 1}).status_code == 200
        yield emu


def test_the_billing_history_parses_into_the_sdk_model_and_the_sdk_reads_it(billed):
    hyperstack = sdk()
    time.sleep(3 * MINUTE_S)
    vm_id = billed.inventory()["virtual_machines"][0]["id"]
    assert _call(billed, "DELETE", f"/core/virtual-machines/{vm_id}").status_code == 200
    answer = _call(billed, "GET", "/billing/billing/history/virtual-machine", params={"search": "kimi-dev"})
    body = answer.json()
    parsed = hyperstack.ResourceLevelVmBillingHistoryResponseModel.from_dict(body)
    assert _lost_keys(body, parsed.to_dict()) == [], "fields the SDK's model does not know"
    config = hyperstack.Configuration(host=billed.base_url, api_key={"apiKey": DEFAULT_API_KEY})
    with hyperstack.ApiClient(config) as client:
        history = hyperstack.BillingApi(client).get_vm_billing_history(search="kimi-dev", per_page=10, page=1)
    rows = {r.attributes.resource_name: r for r in history.billing_history_vm.billing_history}
    assert set(rows) == {"kimi-dev-node0", "kimi-dev-node1"}
    # Deleted VMs stay in the bill; 8 H100 at $2.60 is $20.80 an hour, billed per started minute.
    assert rows["kimi-dev-node0"].attributes.status == "DELETED"
    for row in rows.values():
        assert row.metrics.price_per_hour == pytest.approx(20.8)
        minutes = round(row.metrics.usage_time * 60)
        assert minutes >= 3 and row.metrics.incurred_bill == pytest.approx(20.8 * minutes / 60, abs=1e-4)
    assert _call(billed, "GET", "/billing/billing/history/virtual-machine",
                 key="wrong").status_code == 401


def test_spend_counts_only_the_stacks_own_vms_across_pages(billed):
    def get(path, query):
        return _call(billed, "GET", path, params=query).json()

    both = spent_usd(get, "kimi-dev", ["kimi-dev-node0", "kimi-dev-node1"])
    one = spent_usd(get, "kimi-dev", ["kimi-dev-node0"])
    assert 0 < one < both
    assert spent_usd(get, "kimi-dev", ["kimi-dev-front"]) == 0.0


def _settings(budget: str):
    return load_settings({"operatorCidr": "81.2.69.1/32", "topology": "h100x4-sglang",
                          "caretakerApiKey": "caretaker-key", "sshPublicKey": PUBLIC_KEY,
                          "environmentName": "kimi-dev", "budgetUsd": budget}, "dev")


def test_up_refuses_a_budget_already_spent_naming_the_key(billed):
    time.sleep(2 * MINUTE_S)
    config = {"hyperstack:apiUrl": billed.base_url, "hyperstack:apiKey": DEFAULT_API_KEY}
    refused = budget_problem(*_guard(_settings("0.01")), config=config)
    assert refused and "kimi-cluster:budgetUsd 0.01 is already spent" in refused
    assert budget_problem(*_guard(_settings("100000")), config=config) is None
    wrong = {"hyperstack:apiUrl": billed.base_url, "hyperstack:apiKey": "wrong"}
    unread = budget_problem(*_guard(_settings("5")), config=wrong)
    assert unread and "could not be read" in unread and "kimi-cluster:budgetUsd" in unread


def _guard(settings: Settings) -> tuple[float | None, str, list[str]]:
    """What the program hands budget_problem of the settings: the budget, the environment, the GPU VMs' names."""
    return settings.budget_usd, settings.env_name, gpu_vm_names(settings)
