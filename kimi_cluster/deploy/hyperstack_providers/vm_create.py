"""A VM's create, step by step: the read-only preflight, the adoption of a VM an earlier run made, the POST whose
lost answer is looked up by name instead of sent twice, and the cleanup that says what may still bill.

Helpers of kimi_cluster/deploy/hyperstack_providers/providers.py's VirtualMachineProvider; a pickled provider names
its class only, so these functions are found through that module's imports.
"""

from __future__ import annotations

import time

from kimi_cluster.deploy.hyperstack_providers import progress
from kimi_cluster.deploy.hyperstack_providers.failures import ProvisioningError
from kimi_cluster.deploy.hyperstack_providers.specs import VmSpec
from kimi_cluster.deploy.hyperstack_providers.vm_lifecycle import GONE, delete_vm_and_wait
from kimi_cluster.hyperstack_api.api import HyperstackClient, HyperstackError
from kimi_cluster.hyperstack_api.records import VmRecord


def preflight(api: HyperstackClient, spec: VmSpec) -> None:
    """Everything before the POST is read-only, so a bad flavor, image or region costs nothing."""
    flavors = api.list_flavors(spec.region)
    if not flavors:
        regions = sorted(r.get("name", "") for r in api.list_regions())
        if spec.region not in regions:
            raise ProvisioningError(f"unknown region {spec.region!r}; Hyperstack offers: {', '.join(regions)}")
        raise ProvisioningError(f"region {spec.region} offers no flavors right now")
    in_stock = sorted(f["name"] for f in flavors if f.get("stock_available"))
    flavor = next((f for f in flavors if f.get("name") == spec.flavor_name), None)
    if flavor is None:
        raise ProvisioningError(
            f"flavor {spec.flavor_name!r} is not offered in {spec.region}; offered: "
            f"{', '.join(sorted(f['name'] for f in flavors))} (in stock: {', '.join(in_stock) or 'none'})")
    if not flavor.get("stock_available"):
        raise ProvisioningError(
            f"flavor {spec.flavor_name!r} is out of stock in {spec.region}; in stock now: "
            f"{', '.join(in_stock) or 'none'}")
    images = sorted({i.get("name", "") for i in api.list_images(spec.region)})
    if spec.image_name not in images:
        raise ProvisioningError(
            f"image {spec.image_name!r} is not available in {spec.region}; available: {', '.join(images)}")
    envs = [e for e in api.list_environments(search=spec.environment_name)
            if e.get("name") == spec.environment_name]
    if not envs:
        raise ProvisioningError(f"environment {spec.environment_name!r} does not exist")
    if envs[0].get("region") != spec.region:
        raise ProvisioningError(f"environment {spec.environment_name!r} is in {envs[0].get('region')}, "
                                f"but the VM asks for region {spec.region}")


def find(api: HyperstackClient, spec: VmSpec) -> list[VmRecord]:
    return [vm for vm in api.list_vms(search=spec.name, environment=spec.environment_name)
            if vm.get("name") == spec.name
            and (vm.get("environment") or {}).get("name") == spec.environment_name
            and vm.get("status") not in GONE]


def adopt(api: HyperstackClient, spec: VmSpec) -> VmRecord | None:
    """A VM with our name and labels is one an earlier run created and never recorded: take it over."""
    found = find(api, spec)
    if not found:
        return None
    if len(found) > 1:
        raise ProvisioningError(
            f"{len(found)} VMs named {spec.name!r} exist in {spec.environment_name!r} (ids "
            f"{', '.join(str(v['id']) for v in found)}); delete the extra ones, then run again")
    vm = found[0]
    missing = set(spec.labels) - set(vm.get("labels") or [])
    if missing:
        raise ProvisioningError(
            f"a VM named {spec.name!r} (id {vm['id']}) already exists in {spec.environment_name!r} without our "
            f"labels {sorted(missing)}; refusing to adopt or duplicate it: rename or delete it")
    flavor = (vm.get("flavor") or {}).get("name")
    image = (vm.get("image") or {}).get("name")
    if flavor != spec.flavor_name or image != spec.image_name:
        raise ProvisioningError(
            f"VM {spec.name!r} (id {vm['id']}) from an earlier interrupted run has flavor {flavor} and image "
            f"{image}, but {spec.flavor_name} and {spec.image_name} are wanted; delete it, then run again")
    if vm.get("status") == "ERROR":
        progress.warn(f"VM {spec.name!r} (id {vm['id']}) left by an earlier run is in ERROR: deleting it")
        delete_vm_and_wait(api, vm["id"], f"VM {spec.name!r} (id {vm['id']})",
                           spec.delete_timeout_seconds, spec.poll_interval_seconds)
        return None
    progress.warn(f"adopting VM {spec.name!r} (id {vm['id']}), created by an earlier run that did not finish")
    return vm


def post(api: HyperstackClient, spec: VmSpec) -> VmRecord:
    try:
        return api.create_vm(name=spec.name, environment_name=spec.environment_name,
                             flavor_name=spec.flavor_name, image_name=spec.image_name, key_name=spec.key_name,
                             labels=spec.labels, user_data=spec.user_data,
                             assign_floating_ip=spec.assign_floating_ip)
    except HyperstackError as err:
        if not err.outcome_unknown:
            raise  # a 4xx answer means nothing was created
        # The VM may exist although the answer was lost: look it up, never send a second create.
        for _ in range(3):
            found = find(api, spec)
            if found:
                progress.warn(f"the create answer for VM {spec.name!r} was lost ({err}); adopting id "
                                f"{found[0]['id']}")
                return found[0]
            time.sleep(spec.poll_interval_seconds)
        raise ProvisioningError(
            f"creating VM {spec.name!r} had an unknown outcome ({err}) and no VM of that name appeared; "
            "run `pulumi up` again: it looks the VM up by name before creating one") from err


def cleanup(api: HyperstackClient, spec: VmSpec, vm: VmRecord) -> str:
    what = f"VM {spec.name!r} (id {vm['id']})"
    try:
        delete_vm_and_wait(api, vm["id"], what, spec.delete_timeout_seconds, spec.poll_interval_seconds)
    except (HyperstackError, ProvisioningError) as err:  # all the client and the wait raise: the report carries both
        return (f"deleting it ALSO FAILED ({err}): {what} may still be billing; delete it in the console, or "
                f"run `pulumi up` again, which adopts a VM named {spec.name!r} with labels {list(spec.labels)}")
    return f"{what} was deleted, nothing is left billing"
