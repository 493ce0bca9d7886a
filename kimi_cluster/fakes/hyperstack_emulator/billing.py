"""Billing (read-only): what each VM of this account has cost, deleted ones included, per started minute at its
flavor's pricebook rate (GET /billing/billing/history/virtual-machine, the SDK's get_vm_billing_history)."""

from __future__ import annotations

import math
from typing import Any

from kimi_cluster.hyperstack_api.records import FlavorRecord

from .catalog import PRICEBOOK
from .query import page, q
from .state import Bill, Cloud, Vm


def vm_price(cloud: Cloud, flavor: FlavorRecord) -> float:
    """The flavor's hourly price: its own pricebook entry, else its GPU model's per GPU-hour times its GPUs."""
    book = {e["name"]: cloud.state.prices.get(e["name"], e["value"]) for e in PRICEBOOK}
    if flavor["name"] in book:
        return float(book[flavor["name"]])
    return float(book.get(flavor["gpu"], 0.0)) * int(flavor["gpu_count"])


def start_bill(cloud: Cloud, vm: Vm) -> None:
    cloud.state.billed[vm.id] = Bill(vm.id, vm.name, vm_price(cloud, vm.flavor), cloud.billing_clock())


def end_bill(cloud: Cloud, vm: Vm) -> None:
    bill = cloud.state.billed.get(vm.id)
    if bill is not None and bill.ended is None:
        bill.ended = cloud.billing_clock()


def billed_minutes(cloud: Cloud, bill: Bill, now: float | None = None) -> int:
    """Started minutes from create to delete (or now): Hyperstack bills per minute."""
    end = bill.ended if bill.ended is not None else (cloud.billing_clock() if now is None else now)
    return max(1, math.ceil((end - bill.started) / cloud.billing_minute_seconds - 1e-9))


def vm_billing_history(cloud: Cloud, query: dict[str, list[str]], body: Any) -> dict[str, Any]:
    """One entry per VM, its rate, its usage in hours (billed minutes / 60) and its bill; `search` by name or id;
    `page`, `per_page`."""
    search = (q(query, "search") or "").lower()
    rows = []
    for bill in sorted(cloud.state.billed.values(), key=lambda b: b.started):
        if search and search not in bill.name.lower() and search != str(bill.vm_id):
            continue
        minutes = billed_minutes(cloud, bill)
        rows.append({"attributes": {"infrahub_id": bill.vm_id, "id": str(bill.vm_id), "resource_name": bill.name,
                                    "status": "DELETED" if bill.ended is not None else "ACTIVE",
                                    "contract_id": None},
                     "metrics": {"price_per_hour": bill.price_per_hour, "usage_time": round(minutes / 60, 6),
                                 "incurred_bill": round(bill.price_per_hour * minutes / 60, 6)}})
    rows_page, number, size = page(rows, query, "per_page", default_size=100)
    pages = max(1, math.ceil(len(rows) / size)) if size else 1
    return {"status": True, "message": "Success",
            "billing_history_vm": {"billing_history": rows_page, "org_id": 1, "total_count": len(rows),
                                   "pagination": {"page": number, "pages": pages, "per_page": size}}}
