"""The emulator's catalog: the regions, flavors, images, pricebook and rule protocols it offers, as records of the
API's own shapes (kimi_cluster/hyperstack_api/records.py)."""

from __future__ import annotations

from typing import Any

from kimi_cluster.hyperstack_api.records import FlavorRecord, ImageRecord, PriceRecord, RegionRecord

REGIONS: list[RegionRecord] = [
    {"id": 1, "name": "CANADA-1", "description": "Canada", "country": "Canada", "green_status": "GREEN"},
    {"id": 2, "name": "NORWAY-1", "description": "Norway", "country": "Norway", "green_status": "GREEN"},
    {"id": 3, "name": "US-1", "description": "United States", "country": "USA", "green_status": "NOT_GREEN"},
]

_NETWORK_OPTIMISED: list[dict[str, Any]] = [{"id": 1, "label": "network_optimised"}]

FLAVORS: list[FlavorRecord] = [
    # Values as a reseller's listing of Hyperstack's catalog gives them (not confirmed on an official page).
    {"id": 101, "name": "n3-H100x8-NVLink", "display_name": "n3-H100x8-NVLink", "region_name": "CANADA-1",
     "gpu": "H100-80G-PCIe-NVLink", "gpu_count": 8, "cpu": 252, "ram": 1440.0, "disk": 100, "ephemeral": 6500,
     "labels": _NETWORK_OPTIMISED},
    # docs.hyperstack.cloud/docs/hardware/flavors.
    {"id": 102, "name": "n3-H100x8", "display_name": "n3-H100x8", "region_name": "CANADA-1",
     "gpu": "H100-80G-PCIe", "gpu_count": 8, "cpu": 252, "ram": 1440.0, "disk": 100, "ephemeral": 6500,
     "labels": []},
    # ASSUMED: the region and the cpu/ram/disk/ephemeral values are not on an official page we could read;
    # the deployment guide says 224 CPUs, 1,920 GB RAM, 1,000 GB root disk, 40,000 GB ephemeral.
    {"id": 103, "name": "n3-B300-SXM6x8", "display_name": "n3-B300-SXM6x8", "region_name": "CANADA-1",
     "gpu": "B300-SXM6", "gpu_count": 8, "cpu": 224, "ram": 1920.0, "disk": 1000, "ephemeral": 40000,
     "labels": _NETWORK_OPTIMISED},
    # A small CPU flavor (documented as not supporting hibernation) so a catalog has more than GPU boxes.
    # The H100 flavor in the other regions too, so a cluster can be placed by stock (not confirmed on an official
    # page for these regions; the shape is the CANADA-1 one).
    {"id": 105, "name": "n3-H100x8-NVLink", "display_name": "n3-H100x8-NVLink", "region_name": "NORWAY-1",
     "gpu": "H100-80G-PCIe-NVLink", "gpu_count": 8, "cpu": 252, "ram": 1440.0, "disk": 100, "ephemeral": 6500,
     "labels": _NETWORK_OPTIMISED},
    {"id": 106, "name": "n3-H100x8-NVLink", "display_name": "n3-H100x8-NVLink", "region_name": "US-1",
     "gpu": "H100-80G-PCIe-NVLink", "gpu_count": 8, "cpu": 252, "ram": 1440.0, "disk": 100, "ephemeral": 6500,
     "labels": _NETWORK_OPTIMISED},
    {"id": 104, "name": "n1-cpu-small", "display_name": "n1-cpu-small", "region_name": "NORWAY-1",
     "gpu": "", "gpu_count": 0, "cpu": 4, "ram": 4.0, "disk": 100, "ephemeral": 0, "labels": []},
    # Hyperstack's flavor-labels page lists CPU-only flavors in CANADA-1 as well: the replicas' front runs on one.
    {"id": 107, "name": "n1-cpu-small", "display_name": "n1-cpu-small", "region_name": "CANADA-1",
     "gpu": "", "gpu_count": 0, "cpu": 4, "ram": 4.0, "disk": 100, "ephemeral": 0, "labels": []},
]

IMAGES: list[ImageRecord] = [
    {"id": 201, "name": "Ubuntu Server 24.04 LTS R570 CUDA 12.8 with Docker", "region_name": "CANADA-1"},
    {"id": 202, "name": "Ubuntu Server 24.04 LTS R595 CUDA 13.2 with Docker", "region_name": "CANADA-1"},
    {"id": 203, "name": "Ubuntu Server 22.04 LTS R570 CUDA 12.8 with Docker", "region_name": "CANADA-1"},
    {"id": 204, "name": "Ubuntu Server 24.04 LTS", "region_name": "NORWAY-1"},
    {"id": 205, "name": "Ubuntu Server 24.04 LTS R570 CUDA 12.8 with Docker", "region_name": "NORWAY-1"},
    {"id": 206, "name": "Ubuntu Server 24.04 LTS R570 CUDA 12.8 with Docker", "region_name": "US-1"},
]

# VMs of each GPU flavor a region can create when nothing of ours runs there; live VMs take from it.
DEFAULT_VMS_IN_STOCK = 16

# Hourly prices per GPU of each GPU model (what Hyperstack's pricing page quotes per GPU-hour), and a few
# non-GPU resources; the same figures as the project's catalog, so only a test that changes one sees a difference.
PRICEBOOK: list[PriceRecord] = [
    {"id": 1, "name": "H100-80G-PCIe-NVLink", "value": 2.60, "original_value": 2.60, "discount_applied": False},
    {"id": 2, "name": "H100-80G-PCIe", "value": 2.40, "original_value": 2.40, "discount_applied": False},
    {"id": 3, "name": "B300-SXM6", "value": 7.40, "original_value": 7.40, "discount_applied": False},
    {"id": 4, "name": "Public IP", "value": 0.00672, "original_value": 0.00672, "discount_applied": False},
    # Per VM-hour, the rate card's figure for the cheapest CPU flavor (kimi_cluster/settings/catalog.py FRONT_FLAVOR).
    {"id": 5, "name": "n1-cpu-small", "value": 0.35, "original_value": 0.35, "discount_applied": False},
]

PROTOCOLS = ["any", "ah", "dccp", "egp", "esp", "gre", "hopopt", "icmp", "igmp", "ip", "ipip", "ipv6-encap",
             "ipv6-frag", "ipv6-icmp", "icmpv6", "ipv6-nonxt", "ipv6-opts", "ipv6-route", "ospf", "pgm", "rsvp",
             "sctp", "tcp", "udp", "udplite", "vrrp"]
