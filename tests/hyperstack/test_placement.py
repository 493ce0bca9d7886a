"""Placement by live stock: the first region that holds the cluster, kept across ups, refused with a table."""

from __future__ import annotations

import pytest

from kimi_cluster.deploy.hyperstack_providers import providers, vm_create
from kimi_cluster.deploy.hyperstack_providers.placement import PlacementError, PlacementProvider
from kimi_cluster.fakes.hyperstack_emulator.emulator import Emulator
from tests.hyperstack.conftest import FLAVOR, env_props, keypair_props, vm_props

pytestmark = pytest.mark.timeout(60)

REGIONS = ["CANADA-1", "NORWAY-1", "US-1"]


def _props(regions=REGIONS, count=4, flavor=FLAVOR):
    return {"regions": list(regions), "flavor_name": flavor, "count": count}


def _billable(emu: Emulator) -> list:
    inventory = emu.inventory()
    return inventory["virtual_machines"] + inventory["environments"]


def test_first_region_out_of_stock_so_the_second_is_chosen(hs: Emulator):
    hs.set_capacity(FLAVOR, 3, region="CANADA-1")  # three VMs, the cluster needs four
    created = PlacementProvider().create(_props())
    assert created.outs["region"] == "NORWAY-1"
    seen = {row["region"]: row for row in created.outs["stock_at_choice"]}
    assert seen["CANADA-1"]["vms_available"] == 3 and not seen["CANADA-1"]["holds_cluster"]
    assert seen["NORWAY-1"]["holds_cluster"] and created.outs["chosen_at"]


def test_a_region_whose_flavor_is_flagged_out_of_stock_is_skipped(hs: Emulator):
    hs.set_stock(FLAVOR, False, region="CANADA-1")
    assert PlacementProvider().create(_props()).outs["region"] == "NORWAY-1"


def test_no_region_can_hold_it_refuses_with_a_table_before_anything_is_billed(hs: Emulator):
    hs.set_capacity(FLAVOR, 2, region="CANADA-1")
    hs.set_stock(FLAVOR, False, region="NORWAY-1")
    with pytest.raises(PlacementError) as err:
        PlacementProvider().create(_props(regions=["CANADA-1", "NORWAY-1", "EU-7"]))
    text = str(err.value)
    assert "no region in kimi-cluster:regions can hold 4 x n3-H100x8-NVLink" in text
    lines = text.splitlines()
    assert any(line.split()[:2] == ["CANADA-1", "2"] and "cannot hold 4" in line for line in lines)
    assert any(line.startswith("  NORWAY-1") and "marked out of stock" in line for line in lines)
    assert any(line.startswith("  EU-7") and "flavor not offered" in line for line in lines)
    assert {r.method for r in hs.requests} == {"GET"} and _billable(hs) == []


def test_the_choice_sticks_when_the_list_and_the_stock_change(hs: Emulator):
    provider = PlacementProvider()
    created = provider.create(_props())
    assert created.outs["region"] == "CANADA-1"
    hs.set_stock(FLAVOR, False, region="CANADA-1")
    hs.clear_requests()
    news = _props(regions=["US-1", "NORWAY-1"])
    diff = provider.diff(created.id, created.outs, news)
    assert diff.changes and not diff.replaces
    updated = provider.update(created.id, created.outs, news)
    assert updated.outs["region"] == "CANADA-1" and updated.outs["regions"] == ["US-1", "NORWAY-1"]
    assert updated.outs["chosen_at"] == created.outs["chosen_at"]
    # An unchanged list is no change at all, and no up asks the stocks endpoint again.
    assert not provider.diff(created.id, updated.outs, news).changes
    assert provider.read(created.id, updated.outs).outs["region"] == "CANADA-1"
    assert hs.requests == []


def test_stock_gone_between_choice_and_vm_create_fails_clearly_and_nothing_bills(hs: Emulator):
    region = PlacementProvider().create(_props(count=1)).outs["region"]
    providers.EnvironmentProvider().create(env_props(region=region))
    providers.KeypairProvider().create(keypair_props())
    hs.set_capacity(FLAVOR, 0, region=region)
    with pytest.raises(providers.ProvisioningError, match=f"out of stock in {region}"):
        providers.VirtualMachineProvider().create(vm_props(region=region))
    assert hs.inventory()["virtual_machines"] == []
    assert hs.calls("POST", "/core/virtual-machines") == []


def test_stock_gone_after_the_preflight_the_create_is_refused_and_nothing_bills(hs: Emulator, monkeypatch):
    providers.EnvironmentProvider().create(env_props())
    providers.KeypairProvider().create(keypair_props())
    preflight = vm_create.preflight

    def then_stock_vanishes(api, spec):
        preflight(api, spec)
        hs.set_capacity(FLAVOR, 0, region="CANADA-1")

    monkeypatch.setattr(vm_create, "preflight", then_stock_vanishes)
    with pytest.raises(providers.HyperstackError, match="No stock available for flavor n3-H100x8-NVLink"):
        providers.VirtualMachineProvider().create(vm_props())
    assert hs.inventory()["virtual_machines"] == []


def test_live_vms_take_from_the_stock_the_endpoint_reports(hs: Emulator):
    from kimi_cluster.hyperstack_api import market

    providers.EnvironmentProvider().create(env_props())
    providers.KeypairProvider().create(keypair_props())
    hs.set_capacity(FLAVOR, 2, region="CANADA-1")
    providers.VirtualMachineProvider().create(vm_props())
    with providers.client() as api:
        table = market.region_stock(api, ["CANADA-1"], FLAVOR)
    assert table[0].vms_available == 1 and table[0].gpu_model == "H100-80G-PCIe-NVLink"


def test_check_refuses_bad_inputs():
    failures = PlacementProvider().check({}, {"regions": [], "flavor_name": "", "count": 0}).failures
    assert {f.property for f in failures} == {"regions", "flavor_name", "count"}


def test_an_existing_environment_fixes_the_region_whatever_the_stock(hs: Emulator):
    """A cluster deployed before placements existed keeps its region even if its region is now short of stock."""
    providers.EnvironmentProvider().create(env_props(name="kimi-old", region="NORWAY-1"))
    hs.set_capacity(FLAVOR, 0, region="NORWAY-1")
    created = PlacementProvider().create({**_props(regions=["CANADA-1"]), "environment_name": "kimi-old"})
    assert created.outs["region"] == "NORWAY-1" and created.outs["stock_at_choice"] == []
    fresh = PlacementProvider().create({**_props(regions=["NORWAY-1", "CANADA-1"]), "environment_name": "kimi-new"})
    assert fresh.outs["region"] == "CANADA-1"


def test_replicas_place_every_gpu_vm_and_the_front_in_one_region(hs: Emulator):
    """replicas >= 2: count is every replica's VMs, and the region must offer the front's CPU flavor in stock."""
    hs.set_capacity(FLAVOR, 7, region="CANADA-1")  # 2 replicas x 4 nodes need 8
    created = PlacementProvider().create({**_props(count=8), "front_flavor_name": "n1-cpu-small"})
    assert created.outs["region"] == "NORWAY-1" and created.outs["front_flavor_name"] == "n1-cpu-small"
    seen = {row["region"]: row for row in created.outs["stock_at_choice"]}
    assert seen["NORWAY-1"]["front"] == {"flavor_name": "n1-cpu-small", "offered": True, "stock_available": True}


def test_a_region_without_the_fronts_flavor_cannot_hold_replicas(hs: Emulator):
    # US-1 offers the GPU flavor but no CPU flavor at all.
    with pytest.raises(PlacementError, match=r"the front \(n1-cpu-small\).*not offered or out of stock in: US-1"):
        PlacementProvider().create({**_props(regions=["US-1"], count=8), "front_flavor_name": "n1-cpu-small"})
    assert _billable(hs) == []
