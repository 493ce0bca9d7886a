"""Least-privilege ingress rules per node: the operator's CIDR reaches SSH, each of apiAllowedCidrs (default: the
operator's CIDR) reaches the API port on the head only, and peers reach each other only from their private /32
addresses (NCCL negotiates ports dynamically, so ports stay open, sources don't).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import pulumi

from components.hyperstack.resources import SecurityRule, VirtualMachine
from components.settings import Settings


@dataclass(frozen=True)
class RuleSpec:
    """One ingress rule, in the shape of Hyperstack's CreateSecurityRulePayload."""

    key: str  # stable resource-name suffix: changing a CIDR replaces the rule, the name stays
    purpose: str
    protocol: str
    remote_ip_prefix: Any  # str, or an Output[str] for peers whose address is known only after create
    ethertype: str = "IPv4"
    port_range_min: int | None = None
    port_range_max: int | None = None

    def describe(self) -> str:
        if self.port_range_min is None:
            ports = "all ports"
        elif self.port_range_min == self.port_range_max:
            ports = f"port {self.port_range_min}"
        else:
            ports = f"ports {self.port_range_min}-{self.port_range_max}"
        return f"ingress {self.protocol} {ports} from {self.remote_ip_prefix} ({self.purpose})"


def _ethertype(cidr: str) -> str:
    return "IPv6" if ipaddress.ip_network(cidr).version == 6 else "IPv4"


def api_rule_key(settings: Settings, cidr: str) -> str:
    """A name per CIDR, not per position: removing one entry leaves the others' rules alone. The operator's own
    CIDR keeps the name "api" it always had, so an existing stack sees no change."""
    if cidr == settings.operator_cidr:
        return "api"
    return "api-" + cidr.replace(".", "-").replace(":", "-").replace("/", "-")


def operator_rules(settings: Settings, rank: int) -> list[RuleSpec]:
    """SSH from the operator only. Only the head answers HTTP (its TLS proxy), so only the head opens the API port,
    once per allowed CIDR."""
    rules = [RuleSpec("ssh", "SSH from the operator", "tcp", settings.operator_cidr,
                      _ethertype(settings.operator_cidr), 22, 22)]
    if rank == 0:
        for cidr in settings.api_cidrs:
            who = "the operator" if cidr == settings.operator_cidr else cidr
            rules.append(RuleSpec(api_rule_key(settings, cidr), f"inference API (TLS proxy) from {who}", "tcp", cidr,
                                  _ethertype(cidr), settings.api_port, settings.api_port))
    return rules


def peer_rules(rank: int, peer_private_ips: list[Any]) -> list[RuleSpec]:
    """Every other node, by its private /32: collectives and the rendezvous on port 20000."""
    rules = []
    for peer_rank, ip in enumerate(peer_private_ips):
        if peer_rank == rank:
            continue
        prefix = ip.apply(lambda v: f"{v}/32") if isinstance(ip, pulumi.Output) else f"{ip}/32"
        rules.append(RuleSpec(f"peer{peer_rank}", f"NCCL, Gloo and rendezvous from node {peer_rank}", "any", prefix))
    return rules


def node_rules(settings: Settings, rank: int, peer_private_ips: list[Any]) -> list[RuleSpec]:
    return operator_rules(settings, rank) + peer_rules(rank, peer_private_ips)


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


# ---- replicas behind a front (replicas >= 2) -----------------------------------------------------------------------


def engine_rule(settings: Settings, front_private_ip: Any) -> RuleSpec:
    """A replica head's engine port, open to the front's private /32 alone: the only way in to an engine."""
    prefix = (front_private_ip.apply(lambda v: f"{v}/32") if isinstance(front_private_ip, pulumi.Output)
              else f"{front_private_ip}/32")
    return RuleSpec("engine", "the engine, from the front only", "tcp", prefix, "IPv4",
                    settings.engine_port, settings.engine_port)


def replica_node_rules(settings: Settings, rank: int, peer_private_ips: list[Any],
                       front_private_ip: Any) -> list[RuleSpec]:
    """SSH from the operator, the replica's own peers, and on its head the engine port from the front. No API port:
    only the front serves the API."""
    rules = [RuleSpec("ssh", "SSH from the operator", "tcp", settings.operator_cidr,
                      _ethertype(settings.operator_cidr), 22, 22)]
    rules += peer_rules(rank, peer_private_ips)
    if rank == 0:
        rules.append(engine_rule(settings, front_private_ip))
    return rules


def fan_out_rules(settings: Settings, replica: int, other_ips: list[Any]) -> list[RuleSpec]:
    """The weight fan-out across replicas: peerPort from every node of the other replicas, by its private /32 (the
    file server behind the stack's peer token; nothing else crosses between replicas)."""
    rules = []
    for i, ip in enumerate(other_ips):
        other = i // settings.nodes
        other = other if other < replica else other + 1
        prefix = ip.apply(lambda v: f"{v}/32") if isinstance(ip, pulumi.Output) else f"{ip}/32"
        rules.append(RuleSpec(f"weights-r{other}-node{i % settings.nodes}",
                              f"weight files from replica {other} node {i % settings.nodes}", "tcp", prefix, "IPv4",
                              settings.peer_port, settings.peer_port))
    return rules


def gpu_node_rules(settings: Settings, replica: int, rank: int, peer_private_ips: list[Any],
                   front_private_ip: Any, other_ips: list[Any]) -> list[RuleSpec]:
    """A GPU node's rules: behind a front (replicas >= 2) its replica's and the fan-out's, else the head serves the
    API itself (node_rules). `peer_private_ips` are its replica's nodes, `other_ips` every other replica's."""
    if not settings.has_front:
        return node_rules(settings, rank, peer_private_ips)
    return (replica_node_rules(settings, rank, peer_private_ips, front_private_ip)
            + fan_out_rules(settings, replica, other_ips))
