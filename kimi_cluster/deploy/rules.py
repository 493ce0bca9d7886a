"""The least-privilege rules as resources: one Hyperstack security rule per RuleSpec (kimi_cluster/plan/firewall.py
says which rules each VM gets and why)."""

from __future__ import annotations

import pulumi

from kimi_cluster.deploy.hyperstack.resources import SecurityRule
from kimi_cluster.plan.firewall import RuleSpec


def security_rules(parent: pulumi.Resource, prefix: str, vm_id: pulumi.Input[str],
                   specs: list[RuleSpec]) -> list[SecurityRule]:
    """One resource per rule, named <prefix>-<key>: a new operatorCidr or apiAllowedCidrs replaces these rules and
    never the VM."""
    return [SecurityRule(f"{prefix}-{spec.key}", vm_id=vm_id, direction="ingress", protocol=spec.protocol,
                         ethertype=spec.ethertype, remote_ip_prefix=spec.remote_ip_prefix,
                         port_range_min=spec.port_range_min, port_range_max=spec.port_range_max,
                         opts=pulumi.ResourceOptions(parent=parent))
            for spec in specs]
