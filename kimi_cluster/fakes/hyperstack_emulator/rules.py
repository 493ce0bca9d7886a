"""A VM's security rules: added and deleted through the API, and applied to the VM's node (its firewall) each time."""

from __future__ import annotations

from typing import Any

from .payloads import RULE, validate_rule
from .state import ApiError, Cloud, Rule, now_iso

Query = dict[str, list[str]]


def new_rule(cloud: Cloud, rule: dict[str, Any]) -> Rule:
    """A rule of a validated payload, with a fresh id."""
    return Rule(id=cloud.next_id(), created_at=now_iso(), port_range_min=rule.get("port_range_min"),
                port_range_max=rule.get("port_range_max"),
                **{k: rule[k] for k in ("direction", "ethertype", "protocol", "remote_ip_prefix")})


def add_rule(cloud: Cloud, query: Query, body: Any, vm_id: str) -> dict[str, Any]:
    rule = validate_rule(body)
    vm = cloud.get_vm(vm_id)
    if vm.deleting_since is not None:
        raise ApiError(404, "not_found", f"Virtual machine with id {vm_id} does not exists")
    key = tuple(rule.get(k) for k in RULE)
    if any(tuple(getattr(r, k) for k in RULE) == key for r in vm.rules.values()):
        raise ApiError(409, "already_exist", "Security group rule already exists")
    new = new_rule(cloud, rule)
    vm.rules[new.id] = new
    cloud.firewall(vm)
    return {"status": True, "message": "Security rule created", "security_rule": new.fields()}


def delete_rule(cloud: Cloud, query: Query, body: Any, vm_id: str, rule_id: str) -> dict[str, Any]:
    vm = cloud.get_vm(vm_id)
    if vm.rules.pop(int(rule_id), None) is None:
        raise ApiError(404, "not_found", f"Security rule with id {rule_id} does not exists")
    cloud.firewall(vm)
    return {"status": True, "message": "Security rule deleted"}
