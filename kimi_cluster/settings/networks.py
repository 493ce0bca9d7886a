"""What kind of network an address or a CIDR is: public, private, loopback; and how wide a CIDR the keys accept.

The keys that name who may reach the nodes (operatorCidr, apiAllowedCidrs: rules.py, cross_rules.py) and what the
nodes may reach (the hub, the kernel cache's store, the caretaker's API URL) decide with these, each with its own
words.
"""

from __future__ import annotations

import ipaddress

# The widest IPv6 operatorCidr accepted: a /48 is one site's allocation.
IPV6_MIN_PREFIX = 48
# The widest IPv4 operatorCidr accepted (a /8 is the largest block ever allocated to one holder); wider than
# IPV4_WARN_PREFIX is accepted with a warning.
IPV4_MIN_PREFIX = 8
IPV4_WARN_PREFIX = 16
# A prefix wider than this (per IP version) lets in far more than one team's network: allowed, but warned about.
WIDE_PREFIX = {4: 16, 6: 48}


def cidr_network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A CIDR as a firewall rule takes it; ValueError otherwise. One check for operatorCidr and apiAllowedCidrs."""
    if "%" in text:  # an IPv6 zone id names an interface of this machine, not a network of the VM's
        raise ValueError(text)
    return ipaddress.ip_network(text.strip(), strict=False)


def on_private_path(host: str) -> bool:
    """The node's own loopback, or an address of a private network: no stranger between the node and it."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name may resolve to anywhere
    return any(address.version == n.version and address in n for n in _PRIVATE_PATHS)


# Loopback and the private networks of RFC 1918, RFC 4193 and RFC 6598 (documentation ranges are not among them: they
# stand for public hosts in examples).
_PRIVATE_PATHS = [ipaddress.ip_network(n) for n in ("127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12",
                                                     "192.168.0.0/16", "fc00::/7", "100.64.0.0/10")]

# An IPv4-mapped IPv6 address (::ffff:a.b.c.d) is an IPv4 address written as IPv6: judged as the IPv4 one.
V4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
# Ranges no public address is in, with the reason shown; documentation ranges are left to placeholders().
_NON_PUBLIC = [(ipaddress.ip_network(n), why) for n, why in (
    ("127.0.0.0/8", "a loopback range"), ("::1/128", "the loopback address"),
    ("169.254.0.0/16", "a link-local range"), ("fe80::/10", "a link-local range"),
    ("10.0.0.0/8", "a private range"), ("172.16.0.0/12", "a private range"), ("192.168.0.0/16", "a private range"),
    ("fc00::/7", "a private (unique local) range"), ("100.64.0.0/10", "a carrier-grade NAT range"),
    ("224.0.0.0/4", "a multicast range"), ("ff00::/8", "a multicast range"), ("240.0.0.0/4", "a reserved range"),
    ("0.0.0.0/8", "a 'this network' range"), ("::/128", "the unspecified address"),
)]


def non_public(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str | None:
    for other, why in _NON_PUBLIC:
        if other.version == net.version and net.overlaps(other):
            return why
    return None


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def loopback_host(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
