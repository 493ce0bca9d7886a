"""Least-privilege ingress rules per node: the operator's CIDR reaches SSH, each of apiAllowedCidrs (default: the
operator's CIDR) reaches the API port on the head only, and peers reach each other only from their private /32
addresses (NCCL negotiates ports dynamically, so ports stay open, sources don't).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import pulumi


@dataclass(frozen=True)
class FirewallInputs:
    """What the rules are made of: the settings' values of the same names."""

    operator_cidr: str
    api_cidrs: tuple[str, ...]
    api_port: int
    engine_port: int
    nodes: int
    peer_port: int
    has_front: bool


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


def api_rule_key(fw: FirewallInputs, cidr: str) -> str:
    """A name per CIDR, not per position: removing one entry leaves the others' rules alone. The operator's own
    CIDR keeps the name "api" it always had, so an existing stack sees no change."""
    if cidr == fw.operator_cidr:
        return "api"
    return "api-" + cidr.replace(".", "-").replace(":", "-").replace("/", "-")


def operator_rules(fw: FirewallInputs, rank: int) -> list[RuleSpec]:
    """SSH from the operator only. Only the head answers HTTP (its TLS proxy), so only the head opens the API port,
    once per allowed CIDR."""
    rules = [RuleSpec("ssh", "SSH from the operator", "tcp", fw.operator_cidr,
                      _ethertype(fw.operator_cidr), 22, 22)]
    if rank == 0:
        for cidr in fw.api_cidrs:
            who = "the operator" if cidr == fw.operator_cidr else cidr
            rules.append(RuleSpec(api_rule_key(fw, cidr), f"inference API (TLS proxy) from {who}", "tcp", cidr,
                                  _ethertype(cidr), fw.api_port, fw.api_port))
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


def node_rules(fw: FirewallInputs, rank: int, peer_private_ips: list[Any]) -> list[RuleSpec]:
    return operator_rules(fw, rank) + peer_rules(rank, peer_private_ips)


# ---- replicas behind a front (replicas >= 2) -----------------------------------------------------------------------


def engine_rule(fw: FirewallInputs, front_private_ip: Any) -> RuleSpec:
    """A replica head's engine port, open to the front's private /32 alone: the only way in to an engine."""
    return _engine_rule(fw.engine_port, front_private_ip)


def _engine_rule(engine_port: int, front_private_ip: Any) -> RuleSpec:
    prefix = (front_private_ip.apply(lambda v: f"{v}/32") if isinstance(front_private_ip, pulumi.Output)
              else f"{front_private_ip}/32")
    return RuleSpec("engine", "the engine, from the front only", "tcp", prefix, "IPv4", engine_port, engine_port)


def replica_node_rules(fw: FirewallInputs, rank: int, peer_private_ips: list[Any],
                       front_private_ip: Any) -> list[RuleSpec]:
    """SSH from the operator, the replica's own peers, and on its head the engine port from the front. No API port:
    only the front serves the API."""
    rules = [RuleSpec("ssh", "SSH from the operator", "tcp", fw.operator_cidr,
                      _ethertype(fw.operator_cidr), 22, 22)]
    rules += peer_rules(rank, peer_private_ips)
    if rank == 0:
        rules.append(engine_rule(fw, front_private_ip))
    return rules


def fan_out_rules(fw: FirewallInputs, replica: int, other_ips: list[Any]) -> list[RuleSpec]:
    """The weight fan-out across replicas: peerPort from every node of the other replicas, by its private /32 (the
    file server behind the stack's peer token; nothing else crosses between replicas)."""
    return _fan_out_rules(fw.nodes, fw.peer_port, replica, other_ips)


def _fan_out_rules(nodes: int, peer_port: int, replica: int, other_ips: list[Any]) -> list[RuleSpec]:
    rules = []
    for i, ip in enumerate(other_ips):
        other = i // nodes
        other = other if other < replica else other + 1
        prefix = ip.apply(lambda v: f"{v}/32") if isinstance(ip, pulumi.Output) else f"{ip}/32"
        rules.append(RuleSpec(f"weights-r{other}-node{i % nodes}",
                              f"weight files from replica {other} node {i % nodes}", "tcp", prefix, "IPv4",
                              peer_port, peer_port))
    return rules


@dataclass(frozen=True)
class NodeRules:
    """A GPU node's rules as the blueprint resolves them: what the settings fix, and how the addresses known only at
    deploy time fill in the rest (`at`). Plain data: no Settings travels with it."""

    rank: int
    fixed: tuple[RuleSpec, ...]  # SSH from the operator; one replica: also the head's API port
    replica: int = 0
    engine_port: int | None = None  # behind a front, the head: its engine port, from the front's private /32
    fan_out_nodes: int = 0  # behind a front: the nodes per replica, whose weight files cross between replicas
    peer_port: int = 0

    def at(self, peer_private_ips: list[Any], front_private_ip: Any, other_ips: list[Any]) -> list[RuleSpec]:
        """`peer_private_ips` are its replica's nodes, `other_ips` every other replica's."""
        rules = [*self.fixed, *peer_rules(self.rank, peer_private_ips)]
        if self.engine_port is not None:
            rules.append(_engine_rule(self.engine_port, front_private_ip))
        if self.fan_out_nodes:
            rules += _fan_out_rules(self.fan_out_nodes, self.peer_port, self.replica, other_ips)
        return rules


def gpu_node_rules(fw: FirewallInputs, replica: int, rank: int) -> NodeRules:
    """A GPU node's rules: behind a front (replicas >= 2) its replica's and the fan-out's, else the head serves the
    API itself (node_rules)."""
    if not fw.has_front:
        return NodeRules(rank, tuple(operator_rules(fw, rank)))
    ssh = RuleSpec("ssh", "SSH from the operator", "tcp", fw.operator_cidr, _ethertype(fw.operator_cidr),
                   22, 22)
    return NodeRules(rank, (ssh,), replica, fw.engine_port if rank == 0 else None, fw.nodes,
                     fw.peer_port)
