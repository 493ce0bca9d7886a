"""The shapes of the records the Hyperstack API answers with (its JSON, keys as documented; every key optional)."""

from __future__ import annotations

from typing import Any, TypedDict


class EnvironmentRecord(TypedDict, total=False):
    id: int
    name: str
    region: str
    created_at: str
    features: dict[str, Any]


class KeypairRecord(TypedDict, total=False):
    id: int
    name: str
    public_key: str
    fingerprint: str
    environment: dict[str, Any]


class SecurityRuleRecord(TypedDict, total=False):
    id: int
    direction: str
    ethertype: str
    protocol: str
    remote_ip_prefix: str
    port_range_min: int | None
    port_range_max: int | None
    status: str


class VmRecord(TypedDict, total=False):
    id: int
    name: str
    status: str
    vm_state: str
    power_state: str
    fixed_ip: str | None
    floating_ip: str | None
    floating_ip_status: str | None
    labels: list[str]
    environment: dict[str, Any]
    flavor: dict[str, Any]
    image: dict[str, Any]
    keypair: dict[str, Any]
    security_rules: list[SecurityRuleRecord]


class FlavorRecord(TypedDict, total=False):
    id: int
    name: str
    region_name: str
    cpu: int
    ram: float
    disk: int
    ephemeral: int
    gpu: str
    gpu_count: int
    stock_available: bool


class ImageRecord(TypedDict, total=False):
    id: int
    name: str
    region_name: str
    type: str
    version: str
