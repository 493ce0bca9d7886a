"""What Hyperstack has and what it charges, now: the stocks endpoint and the pricebook, read through HyperstackClient.

- `GET /core/stocks` groups stock by region and GPU model; `configurations` counts how many VMs of each size
  ("1x", "2x", "4x", "8x", "10x" GPUs) can be created right now. The API documents the figures as lower bounds.
- `GET /pricebook` is a bare JSON array of `{name, value, original_value, discount_applied, start_time, end_time}`,
  hourly running costs of every resource Hyperstack sells (docs.hyperstack.cloud/docs/api-reference/get-pricebook).

Both shapes are those of the vendor SDK's models (NewStockRetriveResponse, PricebookModel); the emulator is checked
against the same models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from .api import HyperstackClient
from .records import FlavorRecord, PriceRecord


@dataclass(frozen=True)
class RegionStock:
    """How many VMs of one flavor a region can create now, and why (offered at all, the flavor's stock flag)."""

    region: str
    flavor_name: str
    offered: bool
    stock_available: bool
    vms_available: int
    gpu_model: str = ""
    gpu_count: int = 0

    def holds(self, count: int) -> bool:
        return self.offered and self.stock_available and self.vms_available >= count

    def describe(self) -> str:
        if not self.offered:
            return "flavor not offered"
        if not self.stock_available:
            return f"{self.vms_available} VMs in stock, flavor marked out of stock"
        return f"{self.vms_available} VMs in stock"


def list_stocks(api: HyperstackClient) -> list[dict[str, Any]]:
    return list(api.request("GET", "/core/stocks").get("stocks") or [])


def list_all_flavors(api: HyperstackClient) -> list[FlavorRecord]:
    """Every flavor of every region (the flavors list without `region`)."""
    groups = api.request("GET", "/core/flavors").get("data") or []
    return [f for g in groups for f in (g.get("flavors") or [])]


def _vms_in_stock(stocks: Sequence[Mapping[str, Any]], region: str, gpu_model: str, gpu_count: int) -> int:
    size = f"{gpu_count}x"
    total = 0
    for entry in stocks:
        if entry.get("region") != region:
            continue
        for model in entry.get("models") or []:
            if model.get("model") == gpu_model:
                value = (model.get("configurations") or {}).get(size)
                total += int(value) if isinstance(value, int) else 0
    return total


def region_stock(api: HyperstackClient, regions: list[str], flavor_name: str) -> list[RegionStock]:
    """For each region in order: is the flavor offered, is it flagged in stock, and how many VMs of it are there."""
    flavors = list_all_flavors(api)
    stocks = list_stocks(api)
    table = []
    for region in regions:
        flavor = next((f for f in flavors if f.get("name") == flavor_name and f.get("region_name") == region), None)
        if flavor is None:
            table.append(RegionStock(region, flavor_name, offered=False, stock_available=False, vms_available=0))
            continue
        gpu_model, gpu_count = str(flavor.get("gpu") or ""), int(flavor.get("gpu_count") or 0)
        table.append(RegionStock(
            region, flavor_name, offered=True, stock_available=bool(flavor.get("stock_available")),
            vms_available=_vms_in_stock(stocks, region, gpu_model, gpu_count), gpu_model=gpu_model,
            gpu_count=gpu_count))
    return table


def format_stock_table(table: list[RegionStock], count: int) -> str:
    width = max([len(r.region) for r in table] + [6])
    lines = [f"  {'region':<{width}}  {'VMs':>4}  verdict"]
    for row in table:
        verdict = "holds the cluster" if row.holds(count) else f"cannot hold {count}: {row.describe()}"
        shown = str(row.vms_available) if row.offered else "-"
        lines.append(f"  {row.region:<{width}}  {shown:>4}  {verdict}")
    return "\n".join(lines)


# --- pricebook ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LivePrice:
    """An hourly price per VM from the pricebook, with the entry it came from."""

    usd_per_vm_hour: float
    entry: str
    per_gpu: bool
    original_usd_per_vm_hour: float | None
    discount_applied: bool


def get_pricebook(api: HyperstackClient) -> list[PriceRecord]:
    body = api.request("GET", "/pricebook")
    if not isinstance(body, list):
        raise ValueError(f"the pricebook answered {type(body).__name__}, not the documented JSON array")
    # Each JSON object is read as the record it is documented to be, as every other answer of the API is.
    return [cast(PriceRecord, entry) for entry in body if isinstance(entry, dict)]


def price_for_flavor(pricebook: Sequence[Mapping[str, Any]], flavor_name: str, gpu_model: str,
                     gpu_count: int) -> LivePrice | None:
    """The entry named after the flavor (a whole VM), else the one named after its GPU model (per GPU-hour).

    The pricebook documents `name` only as "Resource name"; Hyperstack prices GPU VMs per GPU-hour on its pricing
    page, so a GPU-model entry is multiplied by the flavor's GPU count.
    """
    by_name = {str(e.get("name")): e for e in pricebook if isinstance(e.get("value"), (int, float))}
    for name, factor, per_gpu in ((flavor_name, 1, False), (gpu_model, gpu_count, True)):
        entry = by_name.get(name) if name else None
        if entry is None or factor < 1:
            continue
        original = entry.get("original_value")
        return LivePrice(
            usd_per_vm_hour=round(float(entry["value"]) * factor, 4), entry=name, per_gpu=per_gpu,
            original_usd_per_vm_hour=round(float(original) * factor, 4) if isinstance(original, (int, float))
            else None,
            discount_applied=bool(entry.get("discount_applied")))
    return None
