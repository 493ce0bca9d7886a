"""The API's routes (paths after /v1) and the endpoint each one runs; a path known under another method is a 405."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from . import billing, catalog_api, drift_injection, environments, rules, vms
from .state import ApiError, Cloud

_ROUTE_TABLE: list[tuple[str, str, Callable[..., Any]]] = [
    ("GET", r"/core/regions", catalog_api.regions),
    ("GET", r"/core/sg-rules-protocols", catalog_api.protocols),
    ("GET", r"/core/flavors", catalog_api.flavors),
    ("GET", r"/core/images", catalog_api.images),
    ("GET", r"/core/stocks", catalog_api.stocks),
    ("GET", r"/pricebook", catalog_api.pricebook),
    ("POST", r"/core/environments", environments.create_environment),
    ("GET", r"/core/environments", environments.list_environments),
    ("GET", r"/core/environments/(\d+)", environments.get_environment),
    ("DELETE", r"/core/environments/(\d+)", environments.delete_environment),
    ("POST", r"/core/keypairs", environments.import_keypair),
    ("GET", r"/core/keypairs", environments.list_keypairs),
    ("DELETE", r"/core/keypair/(\d+)", environments.delete_keypair),
    ("POST", r"/core/virtual-machines", vms.create_vms),
    ("GET", r"/core/virtual-machines", vms.list_vms),
    ("GET", r"/core/virtual-machines/(\d+)", vms.get_vm),
    ("DELETE", r"/core/virtual-machines/(\d+)", vms.delete_vm),
    ("PUT", r"/core/virtual-machines/(\d+)/label", vms.set_labels),
    ("GET", r"/core/virtual-machines/(\d+)/events", vms.vm_events),
    ("POST", r"/core/virtual-machines/(\d+)/sg-rules", rules.add_rule),
    ("DELETE", r"/core/virtual-machines/(\d+)/sg-rules/(\d+)", rules.delete_rule),
    ("GET", r"/billing/billing/history/virtual-machine", billing.vm_billing_history),
    *drift_injection.ROUTES,
]
ROUTES: list[tuple[str, re.Pattern[str], Callable[..., Any]]] = [(m, re.compile(p), f) for m, p, f in _ROUTE_TABLE]


def route(cloud: Cloud, method: str, path: str, query: dict[str, list[str]], body: Any) -> Any:
    """The answer of the endpoint at `path`; raises ApiError."""
    known = False
    for route_method, pattern, func in ROUTES:
        match = pattern.fullmatch(path)
        if match:
            known = True
            if route_method == method:
                return func(cloud, query, body, *match.groups())
    if known:
        raise ApiError(405, "not_allowed", f"method {method} not allowed on {path}")
    raise ApiError(404, "not_found", f"no route {path}")
