"""The least-privilege rules as resources: one Hyperstack security rule per RuleSpec (kimi_cluster/plan/firewall.py
says which rules each VM gets and why)."""

from __future__ import annotations

import pulumi

from kimi_cluster.deploy.hyperstack_providers.resources import SecurityRule, VirtualMachine
from kimi_cluster.plan.firewall import RuleSpec


def security_rules(parent: pulumi.Resource, prefix: str, vm: VirtualMachine,
                   specs: list[RuleSpec]) -> list[SecurityRule]:
    """One resource per rule, named <prefix>-<key>: a new operatorCidr or apiAllowedCidrs replaces these rules and
    never the VM.

    Each rule is `deleted_with` its VM: Hyperstack keeps a VM's rules on the VM (`/core/virtual-machines/{id}/
    sg-rules`), so deleting the VM deletes them, and Pulumi's engine skips a resource's delete when the resource
    named by its `deletedWith` is being deleted too (a destroy, or the VM's replacement). A destroy of the 4-node
    stack thus makes no call per rule (tests/sandbox/test_drift_flow.py counts them in the emulator's request log);
    a rule replaced on its own (a new operatorCidr) is still deleted by its own call. The option is no input: adding
    it to a stack's rules changes nothing a diff sees (tests/sandbox/test_upgrade_flow.py)."""
    options = pulumi.ResourceOptions(parent=parent, deleted_with=vm)
    return [SecurityRule(f"{prefix}-{spec.key}", vm_id=vm.vm_id, direction="ingress", protocol=spec.protocol,
                         ethertype=spec.ethertype, remote_ip_prefix=spec.remote_ip_prefix,
                         port_range_min=spec.port_range_min, port_range_max=spec.port_range_max, opts=options)
            for spec in specs]
