"""Placement: which region the cluster lives in, chosen once from live stock and then kept.

    Placement(resource_name, *, regions, flavor_name, count, environment_name=None, opts=None)
        -> region, chosen_at, stock_at_choice, regions, flavor_name, count, environment_name

On create it reads the stocks endpoint and the flavors of every listed region and picks the first region, in the
order given, that can create `count` VMs of `flavor_name` now. When none can, it fails with a table of what each
region has, before anything billable exists (the environment and the VMs depend on its `region` output).

An environment of `environment_name` that already exists (a cluster deployed before placements existed, or an up
interrupted after creating it) fixes the region to its own: its VMs, if any, already hold their stock there.

The choice is sticky: later changes to the list, the flavor or the count update the inputs but never the chosen
region, and no `up` re-reads stock for it, so a running cluster never moves. Moving on purpose means
`pulumi destroy`, then `pulumi up`: with the environment gone, the next placement is a fresh choice. (Replacing
only this resource would not move anything: the environment still exists and fixes the region.)

There is no cloud object behind a placement: read echoes the state and delete has nothing to remove.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pulumi
import pulumi.dynamic
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ReadResult, UpdateResult

from kimi_cluster.deploy.hyperstack_providers import progress
from kimi_cluster.deploy.hyperstack_providers.failures import ProvisioningError
from kimi_cluster.deploy.hyperstack_providers.inputs import known
from kimi_cluster.deploy.hyperstack_providers.providers import HyperstackProvider, client
from kimi_cluster.hyperstack_api.market import format_stock_table, region_stock

_INPUTS = ("regions", "flavor_name", "count", "environment_name", "front_flavor_name")


class PlacementError(ProvisioningError):
    """No listed region can hold the cluster right now; the message carries the per-region table."""


def choose_region(regions: list[str], flavor_name: str, count: int,
                  front_flavor_name: str | None = None) -> tuple[str, list[dict[str, Any]]]:
    """The first region that holds `count` VMs of the flavor (and, with replicas, offers the front's CPU flavor in
    stock), and the stock seen in every region."""
    with client() as api:
        table = region_stock(api, regions, flavor_name)
        # CPU flavors are not in the stocks endpoint's GPU models: the flavor's own stock flag is what there is.
        fronts = {r.region: r for r in region_stock(api, regions, front_flavor_name)} if front_flavor_name else {}
    seen: list[dict[str, Any]] = []
    for r in table:
        entry: dict[str, Any] = {"region": r.region, "vms_available": r.vms_available, "offered": r.offered,
                                 "stock_available": r.stock_available, "holds_cluster": r.holds(count)}
        if front_flavor_name:
            f = fronts[r.region]
            entry["front"] = {"flavor_name": front_flavor_name, "offered": f.offered,
                              "stock_available": f.stock_available}
            entry["holds_cluster"] = entry["holds_cluster"] and f.offered and f.stock_available
        seen.append(entry)
    for entry in seen:
        if entry["holds_cluster"]:
            return str(entry["region"]), seen
    if front_flavor_name and any(row.holds(count) for row in table):
        without = ", ".join(r for r, f in fronts.items() if not (f.offered and f.stock_available))
        raise PlacementError(
            f"no region in kimi-cluster:regions holds both {count} x {flavor_name} and the front "
            f"({front_flavor_name}) right now; nothing was created. The front's flavor is not offered or out of stock "
            f"in: {without}. Set kimi-cluster:frontFlavor to a CPU flavor those regions offer, or add a region")
    raise PlacementError(
        f"no region in kimi-cluster:regions can hold {count} x {flavor_name} right now; nothing was created. "
        f"Stock per region (Hyperstack stocks endpoint):\n{format_stock_table(table, count)}\n"
        "Add a region to kimi-cluster:regions, choose another topology or flavor, or try again later")


class PlacementProvider(HyperstackProvider):
    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = []
        regions, flavor, count = news.get("regions"), news.get("flavor_name"), news.get("count")
        if known(regions) and not (isinstance(regions, list) and regions
                                    and all(isinstance(r, str) and r for r in regions)):
            failures.append(CheckFailure("regions", "regions must be a non-empty list of region names"))
        if known(flavor) and not (isinstance(flavor, str) and flavor):
            failures.append(CheckFailure("flavor_name", "flavor_name must be a non-empty string"))
        if known(count) and not (isinstance(count, (int, float)) and count >= 1 and int(count) == count):
            failures.append(CheckFailure("count", "count must be a whole number of VMs, at least 1"))
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # Never a replacement: a new list, flavor or count is recorded, the chosen region stays.
        changed = [k for k in _INPUTS if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(changed), replaces=[], stables=["region", "chosen_at", "stock_at_choice"])

    def create(self, props: dict[str, Any]) -> CreateResult:
        regions, flavor, count = list(props["regions"]), str(props["flavor_name"]), int(props["count"])
        front_flavor = props.get("front_flavor_name") or None
        env_name = props.get("environment_name")
        existing = self._existing_region(env_name) if env_name else None
        if existing is not None:
            region, seen = existing, list[dict[str, Any]]()
            progress.info(f"placement: environment {env_name!r} already exists in {region}; the cluster stays there")
        else:
            region, seen = choose_region(regions, flavor, count, front_flavor)
            front_note = f" and the front ({front_flavor})" if front_flavor else ""
            progress.info(f"placement: {region} chosen for {count} x {flavor}{front_note} (first of "
                            f"{', '.join(regions)} with stock); later ups keep it")
        outs = {"regions": regions, "flavor_name": flavor, "count": count, "environment_name": env_name,
                "region": region, "chosen_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "stock_at_choice": seen}
        if front_flavor:
            outs["front_flavor_name"] = front_flavor
        return CreateResult(f"placement-{region}", outs)

    @staticmethod
    def _existing_region(env_name: str) -> str | None:
        with client() as api:
            envs = [e for e in api.list_environments(search=env_name) if e.get("name") == env_name]
        return str(envs[0]["region"]) if envs and envs[0].get("region") else None

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        region = olds["region"]
        if region not in (news.get("regions") or []):
            progress.warn(f"placement: the cluster stays in {region}, which kimi-cluster:regions no longer lists; "
                            "a running cluster is never moved (to move it: pulumi destroy, then pulumi up)")
        return UpdateResult({**olds, **{k: news[k] for k in _INPUTS if k in news}, "region": region})

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        return ReadResult(id_, props)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None  # nothing exists in the cloud for a placement


class Placement(pulumi.dynamic.Resource, module="hyperstack", name="Placement"):
    """The cluster's region: the first of `regions` with stock for `count` x `flavor_name`, chosen once."""

    region: pulumi.Output[str]
    chosen_at: pulumi.Output[str]
    stock_at_choice: pulumi.Output[list]

    def __init__(
        self,
        resource_name: str,
        *,
        regions: Sequence[str],
        flavor_name: pulumi.Input[str],
        count: pulumi.Input[int],
        environment_name: pulumi.Input[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
        front_flavor_name: pulumi.Input[str] | None = None,
    ) -> None:
        props = {"regions": list(regions), "flavor_name": flavor_name, "count": count,
                 "environment_name": environment_name, "region": None,
                 "chosen_at": None, "stock_at_choice": None}
        if front_flavor_name is not None:  # replicas >= 2 only: a one-replica stack's inputs stay as they were
            props["front_flavor_name"] = front_flavor_name
        super().__init__(PlacementProvider(), resource_name, props, opts)
