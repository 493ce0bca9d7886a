"""The read-only catalog endpoints: regions, rule protocols, flavors, images, stocks and the pricebook."""

from __future__ import annotations

from typing import Any

from kimi_cluster.hyperstack_api.records import FlavorRecord, ImageRecord, PriceRecord, RegionRecord

from .answers import flavor_record, image_record
from .catalog import FLAVORS, IMAGES, PRICEBOOK, PROTOCOLS, REGIONS
from .lifecycle import vms_left
from .query import page, q
from .state import Cloud

Query = dict[str, list[str]]


def regions(cloud: Cloud, query: Query, body: Any) -> dict[str, Any]:
    listed = [RegionRecord(**r, features={}) for r in REGIONS]
    return {"status": True, "message": "Getting regions success", "regions": listed}


def protocols(cloud: Cloud, query: Query, body: Any) -> dict[str, Any]:
    return {"status": True, "message": "Success", "protocols": PROTOCOLS}


def flavors(cloud: Cloud, query: Query, body: Any) -> dict[str, Any]:
    region = q(query, "region")
    groups: dict[tuple[str, str], list[FlavorRecord]] = {}
    for flavor in FLAVORS:
        if region is None or flavor["region_name"] == region:
            groups.setdefault((flavor["gpu"], flavor["region_name"]), []).append(flavor_record(cloud, flavor))
    data = [{"gpu": gpu, "region_name": reg, "flavors": fl} for (gpu, reg), fl in groups.items()]
    return {"status": True, "message": "Success", "data": data}


def stocks(cloud: Cloud, query: Query, body: Any) -> dict[str, Any]:
    """Per region and GPU model: how many VMs of each size can be created now (whole 8-GPU hosts here)."""
    out = []
    for region in REGIONS:
        models: dict[str, int] = {}
        for flavor in FLAVORS:
            if flavor["region_name"] == region["name"] and flavor["gpu_count"]:
                gpus = vms_left(cloud, str(region["name"]), flavor) * flavor["gpu_count"]
                models[flavor["gpu"]] = max(models.get(flavor["gpu"], 0), gpus)
        out.append({"region": region["name"], "stock-type": "GPU", "models": [
            {"model": model, "available": f"{gpus}+" if gpus else "0", "planned_7_days": None,
             "planned_30_days": None, "planned_100_days": None,
             "configurations": {"1x": gpus, "2x": gpus // 2, "4x": gpus // 4, "8x": gpus // 8, "10x": 0}}
            for model, gpus in models.items()]})
    return {"stocks": out}


def pricebook(cloud: Cloud, query: Query, body: Any) -> list[PriceRecord]:
    # A bare JSON array, no status/message envelope (docs.hyperstack.cloud/docs/api-reference/get-pricebook).
    return [{**entry, "value": cloud.state.prices.get(entry["name"], entry["value"]), "start_time": None,
             "end_time": None} for entry in PRICEBOOK]


def images(cloud: Cloud, query: Query, body: Any) -> dict[str, Any]:
    region, search = q(query, "region"), (q(query, "search") or "").lower()
    found = [image_record(i) for i in IMAGES if (region is None or i["region_name"] == region)
             and search in i["name"].lower()]
    found, _, _ = page(found, query, "per_page", default_size=None)
    groups: dict[str, list[ImageRecord]] = {}
    for image in found:
        groups.setdefault(image["region_name"], []).append(image)
    return {"status": True, "message": "Success", "images": [
        {"region_name": reg, "type": "Ubuntu", "logo": "", "images": imgs} for reg, imgs in groups.items()]}
