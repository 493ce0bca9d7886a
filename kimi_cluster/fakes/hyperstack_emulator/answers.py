"""The emulator's answers, built as the API's record shapes that the client reads
(kimi_cluster/hyperstack_api/records.py): the shape is declared there once, and mypy checks every key and type built
here against it."""

from __future__ import annotations

from typing import Any

from kimi_cluster.hyperstack_api.records import (
    EnvironmentRecord,
    FlavorRecord,
    ImageRecord,
    KeypairRecord,
    VmEnvironmentRecord,
    VmFlavorRecord,
    VmRecord,
)

from .lifecycle import status, vms_left
from .state import Cloud, Vm

_VM_STATES = {"ACTIVE": "active", "ERROR": "error", "DELETING": "deleted", "SHUTOFF": "stopped"}


def environment_record(env: dict[str, Any]) -> EnvironmentRecord:
    return EnvironmentRecord(id=env["id"], name=env["name"], region=env["region"], created_at=env["created_at"],
                             features=_environment_features(env))


def _environment_features(env: dict[str, Any]) -> dict[str, Any]:
    return {"network_optimised": env["region"] == "CANADA-1", "green_status": "GREEN"}


def keypair_record(cloud: Cloud, kp: dict[str, Any]) -> KeypairRecord:
    env = environment_record(cloud.state.environments[kp["environment_id"]])
    return KeypairRecord(id=kp["id"], name=kp["name"], public_key=kp["public_key"], fingerprint=kp["fingerprint"],
                         created_at=kp["created_at"], environment=env)


def flavor_record(cloud: Cloud, flavor: FlavorRecord) -> FlavorRecord:
    key = (flavor["region_name"], flavor["name"])
    return FlavorRecord(
        **flavor, features={}, created_at="2025-01-01T00:00:00+00:00",
        stock_available=cloud.state.stock.get(key, True) and vms_left(cloud, key[0], flavor) > 0,
        image_restrictions={"has_image_restrictions": False, "restriction_type": None, "compatible_images": []})


def image_record(image: ImageRecord) -> ImageRecord:
    return ImageRecord(
        **image, type="Ubuntu", version=image["name"].removeprefix("Ubuntu "), size=107374182400,
        display_size="100.0 GB", description=image["name"], is_public=True, labels=[],
        flavor_restrictions={"has_flavor_restrictions": False, "restriction_type": None, "compatible_flavors": []})


def vm_record(cloud: Cloud, vm: Vm) -> VmRecord:
    state, fip_status, floating_ip = status(cloud, vm)
    env = cloud.state.environments[vm.environment_id]
    f = vm.flavor
    flavor = VmFlavorRecord(id=f["id"], name=f["name"], cpu=f["cpu"], ram=f["ram"], disk=f["disk"],
                            ephemeral=f["ephemeral"], gpu=f["gpu"], gpu_count=f["gpu_count"], labels=f["labels"],
                            features={})
    return VmRecord(
        id=vm.id, name=vm.name, status=state,
        power_state={"ACTIVE": "RUNNING", "SHUTOFF": "SHUTDOWN"}.get(state, "NOSTATE"),
        vm_state=_VM_STATES.get(state, "building"),
        fixed_ip=None if state == "CREATING" else vm.fixed_ip,
        floating_ip=floating_ip, floating_ip_status=fip_status,
        port_randomization=False, port_randomization_status=None,
        requires_public_ip=vm.assign_floating_ip, locked=False, os="ubuntu",
        callback_url=None, created_at=vm.created_at, labels=list(vm.labels),
        contract_id=None, cluster_id=None, dedicated_inference_id=None, features={},
        enhanced_metrics={"enabled": False},
        environment=VmEnvironmentRecord(id=env["id"], name=env["name"], org_id=1, region=env["region"],
                                        features=_environment_features(env)),
        flavor=flavor,
        image={"name": vm.image_name}, keypair={"name": vm.key_name},
        security_rules=[r.fields() for r in vm.rules.values()],
        volume_attachments=[],
    )
