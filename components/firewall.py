"""Least-privilege ingress rules per node: the operator's CIDR reaches SSH (and the API on the head), peers reach
each other only from their private /32 addresses (NCCL negotiates ports dynamically, so ports stay open, sources don't).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import pulumi

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


def operator_rules(settings: Settings, rank: int) -> list[RuleSpec]:
    """Only the head answers HTTP, so only the head opens the API port."""
    ethertype = "IPv6" if ipaddress.ip_network(settings.operator_cidr).version == 6 else "IPv4"
    rules = [RuleSpec("ssh", "SSH from the operator", "tcp", settings.operator_cidr, ethertype, 22, 22)]
    if rank == 0:
        rules.append(RuleSpec("api", "inference API from the operator", "tcp", settings.operator_cidr, ethertype,
                              settings.api_port, settings.api_port))
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
