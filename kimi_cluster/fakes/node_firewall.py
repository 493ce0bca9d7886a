"""A fake node's firewall: Hyperstack's security rules as one nftables ruleset (kimi_cluster/fakes/node_fabric.py
loads it into the VM's namespace)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any


def nft_ruleset(rules: Iterable[Mapping[str, Any]]) -> str:
    """Hyperstack security rules as nftables: ingress rules accept, all else in is dropped; egress is open.

    A rule is the API's shape: direction, ethertype (IPv4/IPv6), protocol (tcp, udp, icmp or any),
    port_range_min/max and remote_ip_prefix.
    """
    lines = ["iif lo accept", "ct state established,related accept",
             # ARP-free IPv6 still needs neighbour discovery on the link.
             "meta l4proto ipv6-icmp icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept"]
    for rule in rules:
        if str(rule.get("direction", "ingress")).lower() != "ingress":
            continue
        family = "ip6" if str(rule.get("ethertype", "IPv4")).lower() == "ipv6" else "ip"
        prefix = str(rule.get("remote_ip_prefix") or ("::/0" if family == "ip6" else "0.0.0.0/0"))
        match = [f"{family} saddr {ipaddress.ip_network(prefix, strict=False)}"]
        protocol = str(rule.get("protocol") or "any").lower()
        low, high = rule.get("port_range_min"), rule.get("port_range_max")
        if protocol in ("tcp", "udp"):
            match.append(f"{protocol} dport {int(low)}-{int(high or low)}" if low else f"meta l4proto {protocol}")
        elif protocol == "icmp":
            match.append("meta l4proto icmp" if family == "ip" else "meta l4proto ipv6-icmp")
        elif protocol not in ("any", ""):
            raise ValueError(f"security rule protocol {protocol!r} has no nftables form here")
        lines.append(" ".join(match) + " accept")
    body = "\n    ".join(lines)
    # Declared, deleted and declared again in one transaction: the old chain goes and the new one comes at once.
    return ("table inet kimi {}\ndelete table inet kimi\ntable inet kimi {\n  chain input {\n"
            "    type filter hook input priority 0; policy drop;\n"
            f"    {body}\n  }}\n}}\n")
