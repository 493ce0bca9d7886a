"""A firewall rule's inputs: the values Hyperstack accepts, what identifies a rule on its VM, and the normal form
(ports and VM id as numbers) that state, diffs and lookups compare."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from pulumi.dynamic import CheckFailure

from kimi_cluster.deploy.hyperstack_providers.inputs import as_int, known, name_failures

PROTOCOLS = frozenset({"any", "ah", "dccp", "egp", "esp", "gre", "hopopt", "icmp", "igmp", "ip", "ipip",
                       "ipv6-encap", "ipv6-frag", "ipv6-icmp", "icmpv6", "ipv6-nonxt", "ipv6-opts", "ipv6-route",
                       "ospf", "pgm", "rsvp", "sctp", "tcp", "udp", "udplite", "vrrp"})

RULE_TEXT_INPUTS = ("direction", "protocol", "ethertype", "remote_ip_prefix")
RULE_PORT_INPUTS = ("port_range_min", "port_range_max")
RULE_INPUTS = ("vm_id", *RULE_TEXT_INPUTS, *RULE_PORT_INPUTS)


def rule_key(rule: Mapping[str, Any]) -> tuple[Any, ...]:
    """What identifies a rule on its VM: every input but the VM, ports as numbers."""
    return (*(rule.get(k) for k in RULE_TEXT_INPUTS), *(opt_int(rule.get(k)) for k in RULE_PORT_INPUTS))


def rule_failures(news: Mapping[str, Any]) -> list[CheckFailure]:
    """What is wrong with a rule's inputs; unknown values (a preview) pass."""
    failures = name_failures(news, "vm_id", "direction", "protocol", "ethertype", "remote_ip_prefix")
    get = news.get
    if known(get("direction")) and get("direction") not in ("ingress", "egress"):
        failures.append(CheckFailure("direction", "direction must be 'ingress' or 'egress'"))
    if known(get("ethertype")) and get("ethertype") not in ("IPv4", "IPv6"):
        failures.append(CheckFailure("ethertype", "ethertype must be 'IPv4' or 'IPv6'"))
    if known(get("protocol")) and get("protocol") not in PROTOCOLS:
        failures.append(CheckFailure("protocol", f"protocol must be one of {', '.join(sorted(PROTOCOLS))}"))
    prefix = get("remote_ip_prefix")
    if known(prefix) and isinstance(prefix, str):
        try:
            net = ipaddress.ip_network(prefix, strict=False)
            if known(get("ethertype")) and (net.version == 4) != (get("ethertype") == "IPv4"):
                failures.append(CheckFailure("remote_ip_prefix", f"{prefix} does not match {get('ethertype')}"))
        except ValueError:
            failures.append(CheckFailure("remote_ip_prefix", f"{prefix!r} is not a CIDR like 203.0.113.7/32"))
    low, high = get("port_range_min"), get("port_range_max")
    for key, value in zip(RULE_PORT_INPUTS, (low, high), strict=True):
        if known(value) and not (isinstance(value, (int, float)) and 1 <= value <= 65535):
            failures.append(CheckFailure(key, f"{key} must be a port between 1 and 65535"))
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and low > high:
        failures.append(CheckFailure("port_range_min", "port_range_min is greater than port_range_max"))
    return failures


def rule_inputs(props: Mapping[str, Any]) -> dict[str, Any]:
    return {"vm_id": str(as_int(props["vm_id"])), **{k: props.get(k) for k in RULE_TEXT_INPUTS},
            **{k: opt_int(props.get(k)) for k in RULE_PORT_INPUTS}}


def opt_int(value: Any) -> int | None:
    return None if value is None else as_int(value)


def rule_value(props: Mapping[str, Any], key: str) -> Any:
    value = props.get(key)
    if key in ("vm_id", *RULE_PORT_INPUTS) and known(value):
        return as_int(value)
    return value
