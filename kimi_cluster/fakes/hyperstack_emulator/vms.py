"""Virtual machines: create (with its rules, its bill and its node's boot), list, get, delete, labels, events, and
the cloud taking one away by itself (a reclaim)."""

from __future__ import annotations

import time
from typing import Any

from .answers import vm_record
from .billing import end_bill, start_bill
from .catalog import FLAVORS, IMAGES
from .faults import StuckInBuild, VmError, for_vm
from .lifecycle import event, status, vms_left
from .payloads import validate, validate_rule
from .query import page, q
from .rules import new_rule
from .state import ApiError, Cloud, Vm, now_iso

Query = dict[str, list[str]]


def create_vms(cloud: Cloud, query: Query, body: Any) -> dict[str, Any]:
    body = validate("CreateInstancesPayload", body)
    count = body["count"]
    if not 1 <= count <= 20:
        raise ApiError(400, "bad_request", "count must be between 1 and 20")
    rules = [validate_rule(r) for r in body.get("security_rules") or []]
    state = cloud.state
    env = cloud.find_env(body["environment_name"])
    if env is None:
        raise ApiError(404, "not_found", f"Environment {body['environment_name']} does not exists")
    key = next((k for k in state.keypairs.values()
                if k["name"] == body["key_name"] and k["environment_id"] == env["id"]), None)
    if key is None:
        raise ApiError(404, "not_found", f"Keypair {body['key_name']} not found in {env['name']}")
    flavor = next((f for f in FLAVORS if f["name"] == body["flavor_name"] and f["region_name"] == env["region"]), None)
    if flavor is None:
        raise ApiError(404, "not_found", f"Flavor {body['flavor_name']} not found in {env['region']}")
    if vms_left(cloud, env["region"], flavor) < count:
        raise ApiError(400, "bad_request", f"No stock available for flavor {flavor['name']} in {env['region']}")
    image = body.get("image_name")
    if image is None or not any(i["name"] == image and i["region_name"] == env["region"] for i in IMAGES):
        raise ApiError(404, "not_found", f"Image {image} not found in {env['region']}")
    names = [body["name"]] if count == 1 else [f"{body['name']}-{i + 1}" for i in range(count)]
    if cloud.vm_names_unique and any(v.name in names and v.environment_id == env["id"] for v in state.vms.values()):
        raise ApiError(409, "already_exist", f"Virtual machine with name {body['name']} already exists")
    created = []
    for name in names:
        fixed_ip = next(cloud.fixed_ips)
        vm = Vm(id=cloud.next_id(), name=name, environment_id=env["id"], flavor=flavor, image_name=image,
                key_name=body["key_name"], labels=list(body.get("labels") or []),
                user_data=body.get("user_data"), assign_floating_ip=bool(body.get("assign_floating_ip")),
                fixed_ip=fixed_ip, floating_ip=next(cloud.floating_ips) if cloud.floating_ips else fixed_ip,
                created=time.monotonic(), created_at=now_iso())
        for rule in rules:
            added = new_rule(cloud, rule)
            vm.rules[added.id] = added
        # Fault injection: the build of this VM fails, or never ends.
        if (fault := cloud.faults.take(VmError, for_vm(name))):
            vm.fate, vm.error_reason = "error", fault.reason
        elif cloud.faults.take(StuckInBuild, for_vm(name)):
            vm.fate = "stuck"
        vm.events.append(event(vm, "info", "CREATING", "Virtual machine creation accepted"))
        state.vms[vm.id] = vm
        if vm.fate != "error":  # a VM that failed to build is not charged
            start_bill(cloud, vm)
        created.append(vm)
        if cloud.nodes is not None and vm.fate == "active":
            try:
                cloud.nodes.boot(vm.fixed_ip, vm.user_data, key["public_key"], [r.fields() for r in vm.rules.values()])
            except Exception as exc:  # noqa: BLE001 - a node that cannot boot is a VM in ERROR, as on the cloud
                vm.fate, vm.error_reason = "error", f"the node did not boot: {exc}"
    return {"status": True, "message": "Virtual machine(s) creation initiated",
            "instances": [vm_record(cloud, v) for v in created]}


def list_vms(cloud: Cloud, query: Query, body: Any) -> dict[str, Any]:
    search = (q(query, "search") or "").lower()
    environment = q(query, "environment")
    exact = (q(query, "exact_environment_match") or "").lower() == "true"
    vms = []
    for vm in sorted(cloud.state.vms.values(), key=lambda v: v.created):
        env_name = cloud.state.environments[vm.environment_id]["name"]
        if search and search not in vm.name.lower() and search != str(vm.id):
            continue
        if environment and (env_name != environment if exact else environment.lower() not in env_name.lower()):
            continue
        vms.append(vm_record(cloud, vm))
    # The OpenAPI default page size for this list is 10: clients that do not page miss VMs.
    listed, number, size = page(vms, query, "pageSize", default_size=10)
    return {"status": True, "message": "Success", "instances": listed, "page": number, "page_size": size,
            "count": len(vms)}


def get_vm(cloud: Cloud, query: Query, body: Any, vm_id: str) -> dict[str, Any]:
    return {"status": True, "message": "Success", "instance": vm_record(cloud, cloud.get_vm(vm_id))}


def delete_vm(cloud: Cloud, query: Query, body: Any, vm_id: str) -> dict[str, Any]:
    vm = cloud.get_vm(vm_id)
    if status(cloud, vm)[0] == "CREATING":
        raise ApiError(409, "conflict", "Virtual machine is currently being created and cannot be deleted yet")
    if vm.deleting_since is None:
        vm.deleting_since = time.monotonic()
        end_bill(cloud, vm)
        cloud.shutdown(vm)
    return {"status": True, "message": "Instance is being deleted."}


def set_labels(cloud: Cloud, query: Query, body: Any, vm_id: str) -> dict[str, Any]:
    body = validate("EditLabelOfAnExistingVMPayload", body)
    vm = cloud.get_vm(vm_id)
    vm.labels = list(body.get("labels") or [])
    return {"status": True, "message": "Labels updated"}


def vm_events(cloud: Cloud, query: Query, body: Any, vm_id: str) -> dict[str, Any]:
    vm = cloud.get_vm(vm_id)
    status(cloud, vm)
    return {"status": True, "message": "Success", "instance_events": list(vm.events)}


def reclaim(cloud: Cloud, name: str, mode: str) -> tuple[int, Any]:
    """What the cloud does to a VM on a hardware fault or a maintenance reclaim: it goes (mode "delete": DELETING,
    then gone, as after a DELETE) or stays in ERROR (mode "error"), without anyone asking the API."""
    with cloud.lock:
        vm = next((v for v in cloud.state.vms.values() if v.name == name and v.deleting_since is None), None)
        if vm is None:
            return 404, {"status": False, "message": f"no live VM named {name!r}"}
        if mode == "delete":
            vm.deleting_since = time.monotonic()
            vm.events.append(event(vm, "warning", "RECLAIMED", "the host reclaimed this virtual machine"))
            end_bill(cloud, vm)
            cloud.shutdown(vm)
        elif mode == "error":
            vm.fate, vm.error_reason = "error", "hypervisor fault: the host of this virtual machine failed"
            cloud.shutdown(vm)  # the failed host ran it: its node is gone too, while the VM stays listed
        else:
            return 400, {"status": False, "message": f"mode must be delete or error, not {mode!r}"}
        return 200, {"status": True, "id": vm.id, "name": vm.name, "mode": mode}
