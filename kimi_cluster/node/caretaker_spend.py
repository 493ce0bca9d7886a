"""What a stack's GPU VMs have cost so far, read from Hyperstack's VM billing history (standard library only).

`GET /billing/billing/history/virtual-machine?search=<name>&page=<n>&per_page=<n>` (the vendor SDK's
`BillingApi.get_vm_billing_history`, answer `ResourceLevelVmBillingHistoryResponseModel`) lists every VM the account
was billed for, deleted ones included, each with its `incurred_bill` in US dollars: Hyperstack bills per minute, at
the VM's rate, and a SHUTOFF VM still bills. The stack's spend is the sum over its own GPU VM names.

Why the billing history and not the VMs' creation times: a VM the caretaker deleted is gone from the VM list but still
in the bill, and on a one-replica stack the caretaker's own disk goes with the head; the billing history is the one
record that survives both, the same for the caretaker (kimi_cluster/node/caretaker.py, which ships this file beside it)
and for the deploying side (kimi_cluster/deploy/caretaker_guard.py, which refuses an `up` whose budget is already
spent).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

BILLING_PATH = "/billing/billing/history/virtual-machine"
PAGE_SIZE = 100
MAX_PAGES = 100  # 10,000 billed VMs matching the stack's environment name: far beyond any one stack


def page_query(search: str, page: int) -> dict[str, str]:
    return {"search": search, "page": str(page), "per_page": str(PAGE_SIZE)}


def _entries(body: Any) -> tuple[list[Mapping[str, Any]], int | None]:
    """(the page's entries, its page count when given); ValueError on a shape the SDK's model would not parse."""
    history = body.get("billing_history_vm") if isinstance(body, Mapping) else None
    if not isinstance(history, Mapping):
        raise ValueError("the billing history answered without billing_history_vm")
    rows = history.get("billing_history") or []
    if not isinstance(rows, list) or not all(isinstance(r, Mapping) for r in rows):
        raise ValueError("billing_history_vm.billing_history is not a list of entries")
    pagination = history.get("pagination")
    pages = pagination.get("pages") if isinstance(pagination, Mapping) else None
    return rows, pages if isinstance(pages, int) and not isinstance(pages, bool) else None


def bill_of(row: Mapping[str, Any]) -> tuple[str, float]:
    """(resource name, incurred bill in USD) of one entry."""
    attributes, metrics = row.get("attributes"), row.get("metrics")
    if not isinstance(attributes, Mapping) or not isinstance(metrics, Mapping):
        raise ValueError("a billing entry without attributes or metrics")
    name, usd = attributes.get("resource_name"), metrics.get("incurred_bill")
    if not isinstance(name, str) or isinstance(usd, bool) or not isinstance(usd, (int, float)) \
            or not math.isfinite(usd) or usd < 0:
        raise ValueError(f"a billing entry whose resource_name or incurred_bill is not usable: {name!r}, {usd!r}")
    return name, float(usd)


def spent_usd(get: Callable[[str, Mapping[str, str]], Any], search: str, names: Iterable[str]) -> float:
    """The sum of every billed VM named in `names`, page after page; `get(path, query)` returns the parsed answer
    (and raises on an HTTP error)."""
    wanted = set(names)
    total = 0.0
    for page in range(1, MAX_PAGES + 1):
        rows, pages = _entries(get(BILLING_PATH, page_query(search, page)))
        for row in rows:
            name, usd = bill_of(row)
            if name in wanted:
                total += usd
        if len(rows) < PAGE_SIZE or (pages is not None and page >= pages):
            return round(total, 6)
    raise ValueError(f"the billing history for {search!r} runs past {MAX_PAGES} pages")
