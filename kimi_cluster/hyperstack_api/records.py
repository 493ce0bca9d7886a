"""The shapes of the records the Hyperstack API answers with (its JSON, keys as documented; every key optional).

Written once: the client reads its answers as these, and the API emulator
(kimi_cluster/fakes/hyperstack_emulator/answers.py) builds its answers as these, so a key the emulator sends is a key
declared here (mypy checks each record it builds, and tests/hyperstack/test_emulator_records.py checks what it
answers). The keys and their types are those of the
vendor's OpenAPI-generated SDK (`hyperstack` on PyPI), which tests/hyperstack/test_emulator_contract.py parses
every emulator answer with.
"""

from __future__ import annotations

from typing import Any, TypedDict


class RegionRecord(TypedDict, total=False):
    id: int
    name: str
    description: str
    country: str
    green_status: str
    features: dict[str, Any]


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
    created_at: str
    environment: EnvironmentRecord


class SecurityRuleRecord(TypedDict, total=False):
    id: int
    direction: str
    ethertype: str
    protocol: str
    remote_ip_prefix: str
    port_range_min: int | None
    port_range_max: int | None
    status: str
    created_at: str


class VmEnvironmentRecord(TypedDict, total=False):
    """The environment as a VM record names it."""

    id: int
    name: str
    org_id: int
    region: str
    features: dict[str, Any]


class VmFlavorRecord(TypedDict, total=False):
    """The flavor as a VM record names it."""

    id: int
    name: str
    cpu: int
    ram: float
    disk: int
    ephemeral: int
    gpu: str
    gpu_count: int
    labels: list[dict[str, Any]]
    features: dict[str, Any]


class VmRecord(TypedDict, total=False):
    id: int
    name: str
    status: str
    vm_state: str
    power_state: str
    fixed_ip: str | None
    floating_ip: str | None
    floating_ip_status: str | None
    port_randomization: bool
    port_randomization_status: str | None
    requires_public_ip: bool
    locked: bool
    os: str
    callback_url: str | None
    created_at: str
    labels: list[str]
    contract_id: int | None
    cluster_id: int | None
    dedicated_inference_id: int | None
    features: dict[str, Any]
    enhanced_metrics: dict[str, Any]
    environment: VmEnvironmentRecord
    flavor: VmFlavorRecord
    image: dict[str, Any]
    keypair: dict[str, Any]
    security_rules: list[SecurityRuleRecord]
    volume_attachments: list[dict[str, Any]]


class VmEventRecord(TypedDict, total=False):
    instance_id: int
    message: str
    object: str
    org_id: int
    reason: str
    time: str
    type: str
    user_id: int


class FlavorRecord(TypedDict, total=False):
    id: int
    name: str
    display_name: str
    region_name: str
    cpu: int
    ram: float
    disk: int
    ephemeral: int
    gpu: str
    gpu_count: int
    labels: list[dict[str, Any]]
    features: dict[str, Any]
    created_at: str
    stock_available: bool
    image_restrictions: dict[str, Any]


class ImageRecord(TypedDict, total=False):
    id: int
    name: str
    region_name: str
    type: str
    version: str
    size: int
    display_size: str
    description: str
    is_public: bool
    labels: list[dict[str, Any]]
    flavor_restrictions: dict[str, Any]


class PriceRecord(TypedDict, total=False):
    """One entry of the pricebook (a bare JSON array of these): hourly running costs, per resource name."""

    id: int
    name: str
    value: float
    original_value: float
    discount_applied: bool
    start_time: str | None
    end_time: str | None
